"""Loads the compiled extension `rlkernels._C`, which registers the C++ CPU and CUDA ops under
`torch.ops.rlkernels`. Importing this module never touches a GPU."""

from __future__ import annotations

import torch

_REBUILD_HINT = (
    "build it with `pip install --no-build-isolation -e .` in the rlkernels checkout (with torch installed "
    "first, and without RLKERNELS_NO_EXT=1)"
)


_LOADED: tuple | None = None  # (module or None, error or None), memoized without functools (dynamo traces it)


def _load():
    global _LOADED
    if _LOADED is None:
        try:
            from rlkernels import _C

            _LOADED = (_C, None)
        except ImportError as e:  # not built, or built against another torch
            _LOADED = (None, e)
    return _LOADED


def ext_available() -> bool:
    """True when the C++ extension is built and loaded (its CPU kernels are then available)."""
    return _load()[0] is not None


def ext_error() -> Exception | None:
    """Why the extension could not be loaded, or None."""
    return _load()[1]


def build_info() -> dict:
    """The extension's build information (version, compiled CUDA archs, CPU threads), or {} if not built."""
    ext = _load()[0]
    return dict(ext.build_info()) if ext is not None else {}


def cuda_ext_built() -> bool:
    """True when the extension was compiled with its CUDA kernels."""
    return bool(build_info().get("cuda", False))


def unavailable_reason(*, cuda: bool = False) -> str | None:
    """None when the extension (with its CUDA kernels if `cuda`) is loaded, else why not and the fix."""
    ext, err = _load()
    if ext is None:
        return f"the rlkernels C++ extension could not be loaded ({err}); {_REBUILD_HINT}"
    if cuda and not cuda_ext_built():
        return (
            "this rlkernels build has no CUDA kernels; rebuild with nvcc and a CUDA build of torch present "
            "(RLKERNELS_CUDA=1 makes the build fail loudly instead of skipping them)"
        )
    return None


def has_native_op(name: str) -> bool:
    """True when `torch.ops.rlkernels.<name>` exists (the extension is loaded and defines it)."""
    return ext_available() and hasattr(torch.ops.rlkernels, name)
