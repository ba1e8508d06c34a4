"""Input validation at the public API boundary: each check raises TypeError/ValueError naming the op,
the argument and what it saw. Value checks (label ranges, finiteness, mask values) run eagerly on CPU
tensors and raise ValueError; on GPU tensors and under torch.compile, where reading a value back would
be a host sync, they go through `torch._assert_async` instead of `.item()`.

Which values are checked: the data a kernel would silently turn into a wrong answer. Rewards, values,
returns and advantages must be finite (a NaN reward zeroed its GRPO group, or the whole batch in "batch"
mode; a NaN old value vanished in the value clip); weights (float masks, is_weights) finite and >= 0
(a -1 mask weight flips a token's sign); integer masks 0/1. Log-probs (logp, old_logp, ref_logp, the DPO
log-probs) are not: -inf is a legitimate log-prob (a token outside a truncated sampler's support), which
the ops' clamped log-ratio turns into a finite loss, and they are the large differentiable tensors of
the hot path. Neither is the entropy (a model output, like logp).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# Integer masks of 0/1 (Hugging Face's attention_mask is int64) are accepted wherever a bool mask is.
INT_MASK_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_tensor(op: str, x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_float(op: str, x, name: str) -> torch.Tensor:
    """A floating-point tensor of a dtype the kernels support."""
    check_tensor(op, x, name)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float64, float16 or bfloat16, got {x.dtype}")
    return x


def check_index(op: str, x, name: str) -> torch.Tensor:
    """An int32/int64 tensor (labels, group ids, offsets)."""
    check_tensor(op, x, name)
    if x.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: {name} must be an int32 or int64 tensor, got {x.dtype}")
    return x


def check_mask(op: str, x, name: str, shape: Sequence[int], shape_of: str) -> torch.Tensor:
    """A bool, integer (0/1) or floating mask of exactly `shape` (the shape of argument `shape_of`); its
    values are checked by `mask_values`, after the device check."""
    check_tensor(op, x, name)
    if x.dtype != torch.bool and x.dtype not in FLOAT_DTYPES and x.dtype not in INT_MASK_DTYPES:
        raise TypeError(f"{op}: {name} must be a bool, integer (0/1) or floating-point tensor, got {x.dtype}")
    check_shape(op, x, name, shape, shape_of)
    return x


def check_ndim(op: str, x: torch.Tensor, name: str, ndims: Iterable[int]) -> torch.Tensor:
    ndims = tuple(ndims)
    if x.dim() not in ndims:
        want = " or ".join(f"{n}-D" for n in ndims)
        raise ValueError(f"{op}: {name} must be {want}, got shape {_shape(x)}")
    return x


def check_shape(op: str, x: torch.Tensor, name: str, shape: Sequence[int], shape_of: str) -> torch.Tensor:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} has shape {_shape(x)} but {shape_of} has shape {tuple(shape)}")
    return x


def check_same_device(op: str, **tensors: torch.Tensor | None) -> torch.device:
    """All given tensors (None skipped) on one device; returns it."""
    named = [(n, t) for n, t in tensors.items() if t is not None]
    device = named[0][1].device
    for _, t in named[1:]:
        if t.device != device:
            seen = ", ".join(f"{m} on {u.device}" for m, u in named)
            raise ValueError(f"{op}: all tensors must be on one device, got {seen}")
    return device


def check_choice(op: str, value, name: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{op}: {name} must be one of {choices}, got {value!r}")
    return value


def check_number(
    op: str,
    value,
    name: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    optional: bool = False,
):
    """A real Python number (not a tensor) within the given bounds."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__}")
    if value != value:
        raise ValueError(f"{op}: {name} must not be NaN")
    if gt is not None and not value > gt:
        raise ValueError(f"{op}: {name} must be > {gt}, got {value}")
    if ge is not None and not value >= ge:
        raise ValueError(f"{op}: {name} must be >= {ge}, got {value}")
    if le is not None and not value <= le:
        raise ValueError(f"{op}: {name} must be <= {le}, got {value}")
    return value


# The longest message, in bytes, that torch._assert_async takes with a CUDA tensor: a longer one raises
# "Message length must be smaller than 255" at every call, before anything is checked (the H200 run of
# 6978e92 failed every policy_loss call so). CPU and fake tensors take any length.
ASYNC_MESSAGE_BYTES = 254
# The end of a message assert_async had to cut; the fake-CUDA check reports any (rlkernels/fake_cuda/).
CUT = " [cut]"


def assert_async(ok: torch.Tensor, message: str) -> None:
    """torch._assert_async(ok, message) with no host sync, the message cut to ASYNC_MESSAGE_BYTES (ending in
    CUT) so that a CUDA tensor's assert takes it."""
    raw = message.encode()
    if len(raw) > ASYNC_MESSAGE_BYTES:
        message = raw[: ASYNC_MESSAGE_BYTES - len(CUT)].decode(errors="ignore") + CUT
    torch._assert_async(ok, message)


def checks_eagerly(x: torch.Tensor) -> bool:
    """True where a value check may read its result back (CPU tensors outside torch.compile): it then
    raises ValueError with the offending value; elsewhere it enqueues `torch._assert_async`."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def assert_in_range(op: str, x: torch.Tensor, name: str, low: int, high: int, *, ignore: int | None = None):
    """Every element of `x` in [low, high) (elements equal to `ignore` excepted), without a host sync
    on GPU tensors: CPU tensors are checked eagerly and raise ValueError; GPU tensors enqueue an async
    assert that fails the stream."""
    if x.numel() == 0:
        return
    bad = (x < low) | (x >= high)
    if ignore is not None:
        bad &= x != ignore
    if checks_eagerly(x):
        if bool(bad.any()):
            first = x[bad][0].item()
            raise ValueError(
                f"{op}: {name} must lie in [{low}, {high})"
                + (f" or equal {ignore}" if ignore is not None else "")
                + f", found {first}"
            )
    else:
        assert_async(~bad.any(), f"{op}: {name} out of range [{low}, {high})")


def _first(x: torch.Tensor, bad: torch.Tensor) -> str:
    """'<value> at index (i, j)' of the first True of `bad` (only ever run on the failing path)."""
    index = tuple(int(i) for i in torch.nonzero(bad)[0])
    return f"{x[index].item()} at index {index}"


def check_finite(op: str, x: torch.Tensor | None, name: str) -> torch.Tensor | None:
    """No NaN or inf anywhere in the floating tensor `x` (None passes), masked positions included: the
    reference formulas multiply by the mask, so a NaN there would still reach the result.

    CPU tensors: one fused reduction, the sum (a NaN or inf makes it non-finite; ~16 us for 256k fp32
    values on one core, where isfinite().all() takes ~400 us); only a non-finite sum (or one that
    overflowed) pays for the exact test. GPU tensors and torch.compile: torch._assert_async."""
    if x is None or x.numel() == 0:
        return x
    d = x.detach()  # the check is no part of the graph
    if not checks_eagerly(d):
        assert_async(torch.isfinite(d).all(), f"{op}: {name} must be finite (found NaN or inf)")
        return x
    total = d.sum(dtype=torch.float32) if d.element_size() < 4 else d.sum()  # 16-bit sums overflow sooner
    if math.isfinite(total.item()):
        return x
    bad = ~torch.isfinite(d)
    if bool(bad.any()):
        nan, count = int(d.isnan().sum()), int(bad.sum())
        raise ValueError(
            f"{op}: {name} must be finite, found {count} non-finite value(s) ({nan} NaN, {count - nan} inf), "
            f"the first {_first(d, bad)}"
        )
    return x


def check_no_nan_where(op: str, x: torch.Tensor | None, name: str, mask: torch.Tensor) -> torch.Tensor | None:
    """No NaN in the log-probs `x` where `mask` (same shape: bool, integer or float weights) keeps the token
    (None passes; -inf is a log-prob). CPU tensors: one sum first (NaN anywhere makes it NaN; NaN at a
    masked-out position then pays for the exact test); GPU tensors and torch.compile:
    torch._assert_async."""
    if x is None or x.numel() == 0:
        return x
    d = x.detach()
    if not checks_eagerly(d):
        assert_async(
            ~(d.isnan() & (mask != 0)).any(), f"{op}: {name} must not be NaN where the mask keeps the token"
        )
        return x
    total = d.sum(dtype=torch.float32) if d.element_size() < 4 else d.sum()
    if not math.isnan(total.item()):
        return x
    bad = d.isnan() & (mask != 0)
    if bool(bad.any()):
        raise ValueError(
            f"{op}: {name} is NaN at {int(bad.sum())} token(s) the mask keeps, the first {_first(d, bad)} "
            "(a log-prob is <= 0, or -inf for a token the policy cannot produce)"
        )
    return x


def check_nonnegative(op: str, x: torch.Tensor | None, name: str) -> torch.Tensor | None:
    """Every element of the floating tensor `x` finite and >= 0 (weights: float masks, importance
    weights; None passes): the minimum >= 0 (NaN propagates into it) and the maximum < inf. Eager on CPU
    tensors, torch._assert_async on GPU tensors and under torch.compile."""
    if x is None or x.numel() == 0:
        return x
    d = x.detach()
    # The faster CPU reductions (256k values, one core): amin + amax for fp32 (28 us; aminmax 45 us) and
    # fp64, aminmax for 16-bit floats (25 us; amin + amax 98 us).
    low, high = torch.aminmax(d) if d.element_size() < 4 else (d.amin(), d.amax())
    ok = (low >= 0) & (high < math.inf)
    if not checks_eagerly(d):
        assert_async(ok, f"{op}: {name} must be finite and >= 0")
    elif not bool(ok):
        bad = ~((d >= 0) & torch.isfinite(d))
        negative = int((d < 0).sum())
        raise ValueError(
            f"{op}: {name} must be finite and >= 0, found {int(bad.sum())} bad value(s) ({negative} "
            f"negative), the first {_first(d, bad)}"
        )
    return x


def mask_values(op: str, mask: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """The mask the kernels read, from a mask that passed `check_mask`: bool as given; float weights
    checked finite and >= 0; an integer mask (Hugging Face's attention_mask) checked to hold only 0 and 1
    and turned into bool (a device op, no host sync; ~110 us for an int64 [64, 4096] mask on one core,
    a third of it the conversion). Eager ValueError on CPU tensors, torch._assert_async on GPU tensors and
    under torch.compile."""
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype.is_floating_point:
        return check_nonnegative(op, mask, f"{name} weights")
    if mask.numel():
        low, high = torch.aminmax(mask)  # one pass (int64 amin alone takes ~10x longer on CPU)
        ok = (low >= 0) & (high <= 1)
        if not checks_eagerly(mask):
            assert_async(ok, f"{op}: {name} of dtype {mask.dtype} must hold only 0 and 1")
        elif not bool(ok):
            raise ValueError(
                f"{op}: {name} of dtype {mask.dtype} must hold only 0 and 1 (as an attention_mask), found "
                f"{_first(mask, (mask != 0) & (mask != 1))}; pass {name} != 0 (bool) to keep every nonzero "
                "position, or a float mask for weights"
            )
    return mask.bool()  # nonzero -> True, as mask != 0 but 3x faster on CPU


def check_linear_weight(op: str, hidden: torch.Tensor, weight) -> torch.Tensor:
    """The LM head `weight` [V, D] of `hidden` [..., D]: float, 2-D, its second dimension D; a weight
    given as [D, V] (e.g. the transpose of lm_head.weight) is named as such."""
    check_float(op, weight, "weight")
    check_ndim(op, weight, "weight", (2,))
    d = hidden.shape[-1] if hidden.dim() else None
    if d == weight.shape[1]:
        return weight
    if d == weight.shape[0]:
        raise ValueError(
            f"{op}: weight looks transposed: got shape {tuple(weight.shape)} = [D, V] for hidden of shape "
            f"{tuple(hidden.shape)}, expected [V, D] = {(weight.shape[1], weight.shape[0])} (pass "
            "lm_head.weight itself, not its transpose)"
        )
    raise ValueError(
        f"{op}: hidden must be [..., D] with D = weight.shape[1] = {weight.shape[1]} (weight is [V, D] = "
        f"{tuple(weight.shape)}), got hidden shape {tuple(hidden.shape)}"
    )


def _kinds(annotation) -> frozenset[str]:
    """The kinds of value a parameter takes ('tensor', 'str', 'bool', 'int', 'float', 'none', 'other'),
    from its (string) annotation: `float | torch.Tensor` takes a float, an int or a tensor. Unannotated: any
    plain value, no tensor or string."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if annotation is inspect.Parameter.empty or not text:
        return frozenset({"bool", "int", "float", "none", "other"})
    kinds = set()
    for part in (p.strip() for p in text.split("|")):
        if "Tensor" in part:
            kinds.add("tensor")
        elif part in ("str", "bool", "int"):
            kinds.add(part)
        elif part == "float":
            kinds |= {"float", "int"}
        elif part == "None":
            kinds.add("none")
        else:
            kinds.add("other")
    return frozenset(kinds)


def _value_kind(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, bool):
        return "bool"
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind.__name__
    return "other"


def _shown(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"<tensor of shape {tuple(value.shape)}>"
    return repr(value) if isinstance(value, (int, float, str, type(None))) else "..."


def keyword_options(fn: Callable) -> Callable:
    """Decorator of a public function whose options are keyword-only: a call with too many positional
    arguments raises a TypeError saying how to call it, each extra argument given to the next
    keyword-only parameter whose annotation takes it (a tensor, a string, a bool, an int, a float):
    `group_advantages(r, 3)` -> "... the options after them are keyword-only, e.g.
    group_advantages(rewards, group_size=3)"
    instead of Python's "takes 1 positional argument but 2 were given". Correct calls cost one len()."""
    params = inspect.signature(fn).parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    options = [(p.name, _kinds(p.annotation)) for p in params if p.kind is p.KEYWORD_ONLY]
    n = len(positional)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if len(args) > n:
            raise TypeError(_positional_hint(fn.__name__, positional, options, args[n:]))
        return fn(*args, **kwargs)

    return wrapper


def _positional_hint(name: str, positional: list[str], options: list, extra: tuple) -> str:
    left = list(options)
    guesses = []
    for value in extra:
        kind = _value_kind(value)
        match = next((o for o in left if kind in o[1]), None)
        if match is None:
            break
        left.remove(match)
        guesses.append(f"{match[0]}={_shown(value)}")
    n = len(positional)
    head = (
        f"{name}() takes {n} positional argument{'s' * (n != 1)} ({', '.join(positional)}) but "
        f"{n + len(extra)} were given: the options after them are keyword-only"
    )
    if len(guesses) < len(extra):
        return f"{head} ({', '.join(o for o, _ in options)})"
    return f"{head}, e.g. {name}({', '.join(positional + guesses)})"
