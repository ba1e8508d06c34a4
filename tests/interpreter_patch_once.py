"""Triton's interpreter patches `triton.language` for a launch (`GridExecutor.__call__` -> `_patch_lang`: the
language objects the kernel's module sees), and then again at every call of a @triton.jit helper inside it
(`InterpretedFunction.__call__` -> `_patch_lang`: `inspect.getmembers` over four namespaces), which took
about a third of an interpreted test's time. `install()` patches, for each launch, both objects a helper can
see the language as (`triton.language` and `triton.language.core`: Triton's own helpers, `tl.zeros`, see the
latter), and makes the helpers' calls inside the launch skip their repeats. The launch's patches are undone
at its end as before, and the kernels compute the same. Where the interpreter lacks these internals (another
Triton), nothing is installed and the tests only run slower; `test_interpreter_patch_once.py` says so."""

from __future__ import annotations

import functools
import threading
import types

_state = threading.local()
_original = None  # the interpreter's own _patch_lang
_original_launch = None  # and GridExecutor.__call__


def _language_probe():
    """A function whose module sees the language as both `triton.language` and `triton.language.core`."""
    import triton.language as tl

    return types.FunctionType((lambda: None).__code__, {"tl": tl, "core": tl.core})


def install() -> bool:
    """Installs the skip (idempotent); False where the interpreter's internals are not the ones known."""
    global _original, _original_launch
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    if executor is None or patch_lang is None or scope is None:
        return False
    if getattr(patch_lang, "_rlk_once", False):
        return True
    _original = patch_lang
    probe = _language_probe()

    @functools.wraps(patch_lang)
    def patch_lang_once(fn):
        if getattr(_state, "patched", False):  # inside a launch: the language is patched already
            return scope()
        return _original(fn)

    launch = _original_launch = executor.__call__

    @functools.wraps(launch)
    def launch_patching_once(self, *args, **kwargs):
        every_language = _original(probe)
        _state.patched = True
        try:
            return launch(self, *args, **kwargs)  # the kernel's own patch skipped too, by patch_lang_once
        finally:
            _state.patched = False
            every_language.restore()

    patch_lang_once._rlk_once = True
    interpreter._patch_lang = patch_lang_once
    executor.__call__ = launch_patching_once
    return True


def uninstall() -> None:
    """Puts the interpreter's own functions back (tests compare the two)."""
    from triton.runtime import interpreter

    if installed():
        interpreter._patch_lang = _original
        interpreter.GridExecutor.__call__ = _original_launch


def installed() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    return getattr(getattr(interpreter, "_patch_lang", None), "_rlk_once", False)
