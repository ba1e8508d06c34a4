"""The error rule of docs/testing.md and the backends a test runs on CPU tensors.

A kernel's output is compared with the float64 reference run on the same (rounded) inputs:
    err(kernel) <= 2 * err(reference at the kernel's dtype) + atol
where err is the largest absolute difference to the float64 result and atol is a small slack relative to
the result's magnitude (a few fp32 ulps), so that exact-in-fp32 references do not demand bit-exactness.
For outputs stored in bf16/fp16 the slack is at least one step of that dtype's grid at the result's largest
magnitude: both the kernel and the reference round to that grid, and two results whose unrounded values
differ by much less than a step can still land on neighboring grid points (seen: a bf16 d weight 0.74 ulp off
where the reference happened to be 0.3 ulp off everywhere, i.e. "2.5x the reference's error").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import types

import torch

from rlkernels import _backend, _ext

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Slack relative to max(1, |reference|): ~16 fp32 ulps; fp64 kernels get ~16 fp64 ulps.
ATOL = {torch.float64: 4e-15, torch.float32: 2e-6, torch.bfloat16: 2e-6, torch.float16: 2e-6}


class Flavor(str):
    """A kernel flavor a test runs on: equal to the `backend=` string the public functions take (so tests
    pass it straight through), plus the device the test's tensors live on and a context the test runs in.

    conftest.py's autouse fixture enters `activate()` for every test parametrized with a Flavor: the
    flavor's device becomes torch's default device (so `torch.randn(...)` in a test lands there) and its
    context is entered. Flavors:
      cpu              the C++ CPU kernels on CPU tensors
      triton-interpret the Triton kernels under TRITON_INTERPRET=1 on CPU tensors (only without a GPU)
      cuda-on-cpu      the CUDA C++ sources compiled for the host and run on CPU tensors
                       (tests/cuda_on_cpu/, only without a GPU)
      cuda             the CUDA C++ kernels on CUDA tensors (a GPU machine)
      triton           the Triton kernels compiled for the GPU, on CUDA tensors (a GPU machine)
    """

    def __new__(cls, name: str, backend: str, device: str = "cpu", context=None):
        obj = super().__new__(cls, backend)
        obj.name = name
        obj.device = torch.device(device)
        obj._context = context
        return obj

    @property
    def kind(self) -> str:
        """What runs, whatever the device: "native-cpu" (the C++ CPU kernels), "native-cuda" (the CUDA C++
        kernels and bindings: on a GPU, or on the CPU harness) or "triton" (compiled or interpreted). Tests
        that expect something of a kernel flavor branch on this, never on the backend string: the
        cuda-on-cpu flavor passes backend="cpu" and must meet the CUDA expectations."""
        return FLAVOR_KINDS[self.name]

    def __format__(self, spec: str) -> str:  # f"{backend}" in assertion messages names the flavor
        return format(self.name, spec)

    def __repr__(self) -> str:
        return f"Flavor({self.name!r})"

    @contextlib.contextmanager
    def activate(self):
        context = self._context() if self._context else contextlib.nullcontext()
        threads = _one_torch_thread() if self.name in EMULATED else contextlib.nullcontext()
        with torch.device(self.device), context, DrawsPlacedExplicitly(), threads:
            yield self


# The flavors that emulate a GPU on the CPU: the interpreter runs one Triton program at a time, and the
# cuda-on-cpu harness runs the simulated CUDA threads on threads of its own. torch's intra-op threads only
# split the tests' small tensor ops around the kernels, which costs more than it saves (these flavors'
# tests took about 10% less time with one thread here). The "cpu" flavor keeps torch's threads: its
# kernels' parallel loops are what it tests.
EMULATED = ("triton-interpret", "cuda-on-cpu")


@contextlib.contextmanager
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


FLAVOR_KINDS = {
    "cpu": "native-cpu",
    "cuda": "native-cuda",
    "cuda-on-cpu": "native-cuda",
    "triton": "triton",
    "triton-interpret": "triton",
}
# Factory functions that draw random numbers onto the default device (which a flavor sets).
_RANDOM_FACTORIES = {torch.randn, torch.rand, torch.randint, torch.randperm, torch.normal}


class DrawsPlacedExplicitly(torch.overrides.TorchFunctionMode):
    """Inside a flavor, a random factory call with a CPU generator must say `device=`. Without it the call
    lands on the flavor's device, and on a GPU flavor a CPU generator then raises (the H200 run: the test
    helpers of rollout_correction, the linear sweep and the preference losses never ran on CUDA). The rule
    holds in every flavor, so the CPU machine finds such a call before a GPU does: draw on the CPU
    (`device="cpu"`) and move the tensor to the flavor's device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        gen = kwargs.get("generator")
        if (
            func in _RANDOM_FACTORIES
            and gen is not None
            and gen.device.type == "cpu"
            and kwargs.get("device") is None
            and not (func is torch.normal and args and isinstance(args[0], torch.Tensor))
        ):
            name = getattr(func, "__name__", str(func))
            raise AssertionError(
                f"torch.{name}(..., generator=<CPU generator>) without device= inside a test flavor: it "
                "would draw on the flavor's device (CUDA on a GPU, where a CPU generator raises). Pass "
                "device='cpu' and move the result with .to(...)"
            )
        return func(*args, **kwargs)


_FLAVOR_CONTEXTS = {}  # flavor name -> () -> context manager, for flavors defined outside this module


def register_flavor_context(name: str, make_context) -> None:
    """Name the context a flavor runs in (e.g. tests/cuda_on_cpu swaps the CPU kernels for the CUDA
    sources compiled for the host)."""
    _FLAVOR_CONTEXTS[name] = make_context


# Triton's interpreter runs these kernels faithfully from triton 3.9 on; 3.6's loads a scalar as a
# one-element array, so a data-dependent `if` or loop bound fails there. Older Tritons are compile-checked
# (python -m rlkernels compile-check) but not interpreted.
MIN_INTERPRETER_TRITON = (3, 9)


def interpreter_usable() -> bool:
    """Triton kernels can run on CPU tensors here: TRITON_INTERPRET=1 and a recent enough Triton."""
    if not (_backend.triton_installed() and _backend.triton_interpreting()):
        return False
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2]) >= MIN_INTERPRETER_TRITON


def gpu_present() -> bool:
    return torch.cuda.is_available()


def kernel_flavors() -> list[Flavor]:
    """The kernel flavors that run on this machine (RLK_TEST_FLAVORS=a,b restricts them by name).

    With a GPU: the C++ CPU kernels, and the CUDA C++ and compiled Triton kernels on CUDA tensors. Without
    one: the C++ CPU kernels, Triton under the interpreter, and the CUDA C++ sources run on the CPU."""
    out = []
    if _ext.ext_available():
        out.append(Flavor("cpu", "cpu"))
    if gpu_present():
        if _ext.unavailable_reason(cuda=True) is None:
            out.append(Flavor("cuda", "cuda", "cuda"))
        if _backend.triton_installed():
            out.append(Flavor("triton", "triton", "cuda"))
    else:
        if interpreter_usable():
            out.append(Flavor("triton-interpret", "triton"))
        if "cuda-on-cpu" in _FLAVOR_CONTEXTS:
            out.append(Flavor("cuda-on-cpu", "cpu", context=_FLAVOR_CONTEXTS["cuda-on-cpu"]))
    wanted = os.environ.get("RLK_TEST_FLAVORS")
    if wanted:
        names = {w.strip() for w in wanted.split(",") if w.strip()}
        out = [f for f in out if f.name in names]
    return out


def to_device(x, device: torch.device):
    """Every tensor of x (tensors, tuples, lists, dicts, SimpleNamespaces) moved to `device`."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(to_device(v, device) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    if isinstance(x, types.SimpleNamespace):
        return types.SimpleNamespace(**to_device(vars(x), device))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = {f.name: to_device(getattr(x, f.name), device) for f in dataclasses.fields(x)}
        return dataclasses.replace(x, **fields)
    return x


def drawn_on_cpu(helper):
    """A test-data helper that draws from a CPU generator: its body runs on the CPU (draws, aranges, index
    tensors), and its tensors come back on the device of the caller's flavor (docs/testing.md). The same
    values on every flavor."""

    @functools.wraps(helper)
    def wrapper(*args, **kwargs):
        device = torch.get_default_device()
        with torch.device("cpu"):
            out = helper(*args, **kwargs)
        return to_device(out, device)

    return wrapper


def plain(backend) -> str:
    """The backend as a plain str, for code that torch.compile traces: dynamo in torch 2.11 cannot compare
    a str subclass such as Flavor with the backend names (the public functions then see an unknown one)."""
    return str(backend)


def chunked_responses(backend) -> int:
    """Responses enough to take the sorted walks of the group ops through three of their chunks on `backend`
    (a flavor, or the plain name of one that runs here): the GPU kernels' chunks are 1024 (csrc/cuda/
    advantages.h; the CPU and cuda-on-cpu flavors take the same 3000), the Triton interpreter's 32
    (triton/advantages.py _parallel_chunk), where 3000 responses would run seconds through its Python scan."""
    interpreted = str(backend) == "triton" and not gpu_present()  # a Flavor is the str of its backend
    return 70 if interpreted else 3000


def cpu_kernel_backends() -> list[Flavor]:
    """Every kernel flavor that runs here (the name predates the GPU flavors)."""
    return kernel_flavors()


def max_err(x: torch.Tensor, ref64: torch.Tensor) -> float:
    """Largest |x - ref64|; a NaN/inf where the oracle is finite (or vice versa) counts as infinite."""
    x = x.detach().to(torch.float64)
    ref64 = ref64.detach().to(torch.float64)
    if x.shape != ref64.shape:
        raise AssertionError(f"shape {tuple(x.shape)} != oracle shape {tuple(ref64.shape)}")
    if x.numel() == 0:
        return 0.0
    same_nonfinite = (
        (~torch.isfinite(x)) & (~torch.isfinite(ref64)) & ((x == ref64) | (x.isnan() & ref64.isnan()))
    )
    diff = (x - ref64).abs()
    diff = torch.where(same_nonfinite, torch.zeros_like(diff), diff)
    diff = torch.where(diff.isnan(), torch.full_like(diff, float("inf")), diff)
    return float(diff.max())


def output_grid_step(dtype: torch.dtype, magnitude: float) -> float:
    """Spacing of a 16-bit float grid at `magnitude` (one ulp there); 0 for fp32/fp64 outputs."""
    if dtype not in (torch.bfloat16, torch.float16):
        return 0.0
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(magnitude))


def assert_oracle(
    name: str, out, ref_same_dtype, ref64, *, atol: float | None = None, dtype=None, magnitude: float = 0.0
) -> None:
    """Assert the error rule for one output against the float64 oracle.

    The atol is relative to the output's size, or to `magnitude` where larger: the size of the terms a
    reduced output sums (Σ|x| in float64). A sum's rounding error scales with Σ|x|, not with the sum, which
    may cancel to near 0 (a loss whose policy and KL parts cancel); the output's own grid step (16-bit
    outputs) stays that of its size.

    Elements whose true value does not fit in `dtype` (|oracle| > finfo.max) are left out; the
    reference's own error is taken over the elements where it stayed finite, so that an overflow in the
    low-precision reference never excuses the kernel elsewhere."""
    dtype = dtype or out.dtype
    # Compared on the CPU, wherever each was computed (a GPU flavor's default device makes CUDA references).
    out = out.detach().cpu()
    ref64 = ref64.detach().to("cpu", torch.float64)
    fits = ref64.abs() <= torch.finfo(dtype).max
    fits |= ref64.isnan()
    if ref_same_dtype is not None:
        ref_same = ref_same_dtype.detach().to("cpu", torch.float64)
        # An oracle that is NaN where the reference is a number excuses nothing: it is a broken oracle (else
        # err_r = inf and any kernel passes).
        broken = ref64.isnan() & ~ref_same.isnan()
        assert not bool(broken.any()), (
            f"{name}: the float64 oracle is NaN at {int(broken.sum())} elements where the reference is not"
        )
        ok = fits & torch.isfinite(ref_same)
        err_r = max_err(ref_same[ok], ref64[ok])
    else:
        err_r = 0.0
    finite_ref = ref64[fits].nan_to_num(0.0, 0.0, 0.0)
    size = max(1.0, float(finite_ref.abs().max())) if finite_ref.numel() else 1.0
    slack = max(
        (ATOL.get(dtype, 2e-6) if atol is None else atol) * max(size, magnitude),
        output_grid_step(out.dtype, size),
    )
    err_k = max_err(out[fits], ref64[fits])
    assert err_k <= 2 * err_r + slack, (
        f"{name}: kernel error {err_k:.3e} > 2 x reference error {err_r:.3e} + {slack:.1e} (dtype {dtype})"
    )


def raises_on_host(backend) -> bool:
    """Whether a bad input value makes the public function raise its ValueError with `backend`'s tensors: on
    CPU tensors. On a GPU it fails a device-side assert instead (torch._assert_async), which ends the
    process's CUDA context: the tests check the kernel's flag there, never the assert in-process."""
    return getattr(backend, "device", torch.device("cpu")).type == "cpu"
