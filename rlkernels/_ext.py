"""Loads the compiled extension `rlkernels._C`, which registers the C++ CPU and CUDA ops under
`torch.ops.rlkernels`. Importing this module never touches a GPU."""

from __future__ import annotations

import torch

_REBUILD_HINT = (
    "build it with `pip install --no-build-isolation -e .` in the rlkernels checkout (with torch installed "
    "first, and without RLKERNELS_NO_EXT=1)"
)


# (module or None, error or None, its build information), memoized without functools: the public functions
# reach it on every call, inside torch.compile's graphs too, where dynamo can trace Python but not a call
# into the pybind module (a first call inside a graph included: the module is imported, and build_info()
# read, when rlkernels.ops registers the native ops at import).
_LOADED: tuple | None = None


def _load():
    global _LOADED
    if _LOADED is None:
        try:
            from rlkernels import _C

            _LOADED = (_C, None, dict(_C.build_info()))
        except ImportError as e:  # not built, or built against another torch
            _LOADED = (None, e, {})
    return _LOADED


def ext_available() -> bool:
    """True when the C++ extension is built and loaded (its CPU kernels are then available)."""
    return _load()[0] is not None


def ext_error() -> Exception | None:
    """Why the extension could not be loaded, or None."""
    return _load()[1]


def build_info() -> dict:
    """The extension's build information (version, compiled CUDA archs, CPU threads), or {} if not built."""
    return dict(_load()[2])


def cuda_ext_built() -> bool:
    """True when the extension was compiled with its CUDA kernels."""
    return bool(_load()[2].get("cuda", False))


def unavailable_reason(*, cuda: bool = False) -> str | None:
    """None when the extension (with its CUDA kernels if `cuda`) is loaded, else why not and the fix."""
    ext, err, _ = _load()
    if ext is None:
        return f"the rlkernels C++ extension could not be loaded ({err}); {_REBUILD_HINT}"
    if cuda and not cuda_ext_built():
        return (
            "this rlkernels build has no CUDA kernels; rebuild with nvcc and a CUDA build of torch present, "
            "on a machine with a GPU, or anywhere with RLKERNELS_CUDA=1 (which fails loudly instead of "
            "skipping them): RLKERNELS_CUDA=1 pip install --no-build-isolation -e ."
        )
    return None


def has_native_op(name: str) -> bool:
    """True when `torch.ops.rlkernels.<name>` exists (the extension is loaded and defines it)."""
    return ext_available() and hasattr(torch.ops.rlkernels, name)
