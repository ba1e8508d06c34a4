"""Triton's interpreter maps a Triton dtype to its numpy dtype (`_get_np_dtype`) for every value it makes, and
built the 19-entry table of that map anew at each call: about a tenth of an interpreted kernel's time in the
group-advantage chunk tests (half a million calls). `install()` keeps the map's answers per scalar dtype,
filled from the interpreter's own function, so the answers are its own. Where the interpreter lacks the
function (another Triton), nothing is installed and the tests only run slower;
`test_interpreter_dtype_table.py` says so."""

from __future__ import annotations

_original = None  # the interpreter's own _get_np_dtype


def _np_dtype_of(tt_dtype):
    """_get_np_dtype: a block's element dtype's numpy dtype (a pointer's is uint64), from the kept answers."""
    import triton.language as tl

    if isinstance(tt_dtype, tl.block_type):
        tt_dtype = tt_dtype.element_ty
    key = _POINTER if isinstance(tt_dtype, tl.pointer_type) else tt_dtype  # every pointer: one answer
    found = _table.get(key)
    if found is None:
        found = _table[key] = _original(tt_dtype)
    return found


_POINTER = object()


_table: dict = {}


def install() -> bool:
    """Installs the kept map (idempotent); False where the interpreter's internals are not the ones known."""
    global _original
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    own = getattr(interpreter, "_get_np_dtype", None)
    if own is None:
        return False
    if own is not _np_dtype_of:
        _original = own
        interpreter._get_np_dtype = _np_dtype_of
    return True


def uninstall() -> None:
    """Puts the interpreter's own function back (tests compare the two)."""
    from triton.runtime import interpreter

    if installed():
        interpreter._get_np_dtype = _original


def installed() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return getattr(interpreter, "_get_np_dtype", None) is _np_dtype_of
