"""Helpers shared by the Triton kernels."""

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting


# Launch arithmetic on the host, in plain Python: triton.cdiv and triton.next_power_of_2 are
# constexpr_functions in recent Triton, whose call costs microseconds of host time per launch.
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of non-negative integers."""
    return -(-a // b)


def round_up(x: int, multiple: int) -> int:
    """x rounded up to a multiple of `multiple` (non-negative integers)."""
    return cdiv(x, multiple) * multiple


def next_pow2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def tl_acc(acc: torch.dtype):
    """The Triton dtype of an accumulation dtype: tl.float64 for torch.float64, else tl.float32."""
    return tl.float64 if acc == torch.float64 else tl.float32


@triton.jit
def to_acc(x):
    """fp32 for every input type but fp64. Cast right after tl.load: bf16 arithmetic is also wrong under
    the interpreter."""
    if x.dtype != tl.float64:
        x = x.to(tl.float32)
    return x


@triton.jit
def float_arg(x, ACC: tl.constexpr):
    """A float option in dtype ACC, exact in fp64. Kernels declare their float options `tl.float64`: Triton
    passes an undeclared Python float as fp32, rounded (the compile check refuses one). tl.full, not
    tl.cast: the interpreter passes the Python float as it is, and tl.cast would round it through fp32."""
    return tl.full([], x, ACC)


@triton.jit
def clamp(x, lo, hi):
    """torch.clamp semantics (NaN stays NaN)."""
    return tl.where(x < lo, lo, tl.where(x > hi, hi, x))


@triton.jit
def clamp_passes(x, lo, hi):
    """Where torch.clamp passes the gradient through (bounds inclusive)."""
    return (x >= lo) & (x <= hi)


@triton.jit
def grouped_tile(pid, num_row_blocks, num_col_blocks, GROUP: tl.constexpr):
    """(row block, column block) of program `pid`: groups of GROUP row blocks x all column blocks, row block
    fastest, so that concurrently running programs share their weight panels in L2."""
    per_group = GROUP * num_col_blocks
    first = (pid // per_group) * GROUP
    group_rows = tl.minimum(num_row_blocks - first, GROUP)
    local = pid % per_group
    return first + local % group_rows, local // group_rows


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the GPU a launch on `device` runs on (Triton launches on the current
    device; the compile check's offline driver answers for its target); 1 on the CPU."""
    if device.type == "cpu":
        return 1
    from triton.runtime import driver

    return driver.active.utils.get_device_properties(driver.active.get_current_device())[
        "multiprocessor_count"
    ]


def compute_capability(device: torch.device) -> int:
    """Compute capability x 10 of the GPU a launch on `device` runs on (the compile check's offline driver
    answers for its target); 0 on the CPU."""
    if device.type == "cpu":
        return 0
    from triton.runtime import driver

    return driver.active.get_current_target().arch


def elementwise_block(n: int) -> int:
    """Elements per program for 1-D elementwise kernels: 1024 (4 warps x 8 elements) on a GPU, which
    keeps loads 128-bit wide; the interpreter runs one numpy op per block, so bigger is faster there."""
    return 1 << 16 if triton_interpreting() else 1024


def store_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel should write for an output of `dtype`. The interpreter converts fp32 -> bf16 by
    truncation (GPUs round to nearest even), so there a bf16 output is written as fp32 and rounded by
    torch afterwards (`.to(dtype)`, a no-op on GPU)."""
    return torch.float32 if dtype == torch.bfloat16 and triton_interpreting() else dtype


def unit_rows(T: int, *tensors) -> tuple[list, list[int], bool]:
    """(tensors, row strides, strided) of token kernels' inputs that take a row stride of their own. A [B, T]
    tensor whose rows' elements are adjacent stays as it is, whatever its rows' stride (verl's response_mask,
    attention_mask[:, -T:], and its log-probs sliced out of the padded sequence are such views; a broadcast
    row has stride 0): no copy; any other is copied contiguous. A [B] tensor stays as it is. Its row stride
    (the kernels' ld) is stride(0): element (b, t) at b * ld + t, element b of a [B] one at b * ld; 0 for an
    absent (None) input. `strided`: some input's ld is not a contiguous one's (T, or 1 for a [B] input).
    One `stride()` call a tensor and no other: a call costs host time on every launch."""
    out, lds, strided = [], [], False
    for t in tensors:
        if t is None:
            out += (None,)
            lds += (0,)
            continue
        s = t.stride()
        if t.ndim == 2 and s[1] != 1 and t.shape[1] > 1:
            t = t.contiguous()
            s = (t.shape[1], 1)
        out += (t,)
        lds += (s[0],)
        strided = strided or s[0] != (T if t.ndim == 2 else 1)
    return out, lds, strided
