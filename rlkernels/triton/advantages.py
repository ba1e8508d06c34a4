"""group_advantages Triton kernels.

Contiguous groups (sort-free): one program holds a tile of BLOCK_G whole groups and computes each
group's mean (around its first reward as pivot, so a constant group gives exactly 0) and centered sum of
squares from registers: every reward is read once and every advantage written once.
Arbitrary ids: each element's group is named by its representative, the index of the group's first
member (`group_representatives`, device ops, no host sync); statistics accumulate at the representative
with atomics (count and pivot-shifted sum, then the centered sum of squares; in fp64 whatever the rewards'
dtype, since atomics add in no fixed order and an fp32 running sum loses the small terms that come after
large ones) and a last pass writes the advantages. Groups too large for one tile take this path too, with
representatives (i // G) * G.
"""

import functools

import torch
import triton
import triton.language as tl

from rlkernels._backend import triton_interpreting
from rlkernels.reference.advantages import GROUP_MODE_CODES
from rlkernels.triton._common import elementwise_block, store_dtype, to_acc
from rlkernels.triton._scalar import join3, split3
from rlkernels.triton._specializations import FLOAT_DTYPES, CompileCase, covering, meta

GRPO = tl.constexpr(GROUP_MODE_CODES["grpo"])
DR_GRPO = tl.constexpr(GROUP_MODE_CODES["dr_grpo"])
RLOO = tl.constexpr(GROUP_MODE_CODES["rloo"])
BATCH = tl.constexpr(GROUP_MODE_CODES["batch"])

# Group widths a tile holds (a group is padded to the next; masked lanes cost no memory traffic, and six
# widths keep first-call compiles few), up to 16384 (fp32: 64 KiB of registers across the program's warps);
# larger groups take the representative path.
GROUP_BLOCKS = (16, 64, 256, 1024, 4096, 16384)
MAX_TILE_GROUP = GROUP_BLOCKS[-1]


@triton.jit
def group_advantage(r, n, mean, m2, eps, bstd, MODE: tl.constexpr):
    """The advantage of r in a group of n with mean `mean` and centered sum of squares m2 (a group of one:
    mean 0, std 1; a zero denominator, possible with eps = 0, gives 0). Mirrors rlk::group_advantage
    (csrc/include/rlkernels/advantages.h)."""
    multi = n > 1.0
    centered = tl.where(multi, r - mean, r)
    nm1 = tl.where(multi, n - 1.0, 1.0)
    if MODE == GRPO:
        denom = tl.where(multi, tl.sqrt(m2 / nm1), 1.0) + eps
        out = tl.where(denom > 0, centered / tl.where(denom > 0, denom, 1.0), 0.0)
    elif MODE == DR_GRPO:
        out = centered
    elif MODE == RLOO:
        out = tl.where(multi, n / nm1 * centered, r)
    else:
        denom = bstd + eps + tl.zeros_like(centered)
        out = tl.where(denom > 0, centered / tl.where(denom > 0, denom, 1.0), 0.0)
    return out


@triton.jit
def _contiguous_kernel(
    r_ptr,  # [num_groups * G] rewards
    out_ptr,  # [num_groups * G]
    bstd_ptr,  # [1] batch std (BATCH; else 1)
    num_groups,
    G,
    e_hi,
    e_mid,
    e_lo,  # eps, split3
    MODE: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    groups = tl.program_id(0).to(tl.int64) * BLOCK_G + tl.arange(0, BLOCK_G)
    cols = tl.arange(0, BLOCK_N)
    in_range = groups < num_groups
    offs = groups[:, None] * G + cols[None, :]
    valid = in_range[:, None] & (cols[None, :] < G)
    r = to_acc(tl.load(r_ptr + offs, mask=valid, other=0.0))
    pivot = tl.sum(tl.where(cols[None, :] == 0, r, 0.0), axis=1)  # each group's first reward
    n = tl.zeros([BLOCK_G], ACC) + G
    mean = pivot + tl.sum(tl.where(valid, r - pivot[:, None], 0.0), axis=1) / n
    d = tl.where(valid, r - mean[:, None], 0.0)
    m2 = tl.sum(d * d, axis=1)
    bstd = tl.load(bstd_ptr).to(ACC)  # 1 unless MODE == BATCH
    eps = join3(e_hi, e_mid, e_lo, ACC)
    out = group_advantage(r, n[:, None], mean[:, None], m2[:, None], eps, bstd, MODE)
    out = tl.where(valid, out, 0.0)  # padding lanes of a tight group could overflow the fp16 cast
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit
def _load_member(r_ptr, rep_ptr, offs, valid):
    r = to_acc(tl.load(r_ptr + offs, mask=valid, other=0.0))
    rep = tl.load(rep_ptr + offs, mask=valid, other=0).to(tl.int64)
    pivot = to_acc(tl.load(r_ptr + rep, mask=valid, other=0.0))
    return r, rep, pivot


@triton.jit
def _sums_kernel(
    r_ptr,  # [B] rewards
    rep_ptr,  # [B] int64 representative of each element's group
    count_ptr,  # [B] fp64 group sizes at the representatives (zeroed)
    sum_ptr,  # [B] fp64 sums of (r - pivot) at the representatives (zeroed)
    B,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < B
    r, rep, pivot = _load_member(r_ptr, rep_ptr, offs, valid)
    tl.atomic_add(count_ptr + rep, tl.where(valid, 1.0, 0.0).to(tl.float64), mask=valid, sem="relaxed")
    tl.atomic_add(sum_ptr + rep, r.to(tl.float64) - pivot.to(tl.float64), mask=valid, sem="relaxed")


@triton.jit
def _group_mean(count_ptr, sum_ptr, rep, pivot, valid):
    """(count, mean) of the member's group, fp64."""
    n = tl.load(count_ptr + rep, mask=valid, other=1.0)
    return n, pivot.to(tl.float64) + tl.load(sum_ptr + rep, mask=valid, other=0.0) / n


@triton.jit
def _m2_kernel(
    r_ptr,  # [B]
    rep_ptr,  # [B]
    count_ptr,  # [B]
    sum_ptr,  # [B]
    m2_ptr,  # [B] fp64 centered sums of squares at the representatives (zeroed)
    B,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < B
    r, rep, pivot = _load_member(r_ptr, rep_ptr, offs, valid)
    _, mean = _group_mean(count_ptr, sum_ptr, rep, pivot, valid)
    d = r.to(tl.float64) - mean
    tl.atomic_add(m2_ptr + rep, d * d, mask=valid, sem="relaxed")


@triton.jit
def _finish_kernel(
    r_ptr,  # [B]
    rep_ptr,  # [B]
    count_ptr,  # [B]
    sum_ptr,  # [B]
    m2_ptr,  # [B]
    out_ptr,  # [B] advantages
    bstd_ptr,  # [1] batch std (BATCH; else 1)
    B,
    e_hi,
    e_mid,
    e_lo,  # eps, split3
    MODE: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < B
    r, rep, pivot = _load_member(r_ptr, rep_ptr, offs, valid)
    n, mean = _group_mean(count_ptr, sum_ptr, rep, pivot, valid)
    m2 = tl.load(m2_ptr + rep, mask=valid, other=0.0)
    bstd = tl.load(bstd_ptr).to(ACC)  # 1 unless MODE == BATCH
    eps = join3(e_hi, e_mid, e_lo, ACC)
    out = group_advantage(r, n.to(ACC), mean.to(ACC), m2.to(ACC), eps, bstd, MODE)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=valid)


def group_representatives(group_ids: torch.Tensor) -> torch.Tensor:
    """group_ids [B] (any integers, any order) -> [B] int64: the index of the first element with the same
    id. A stable sort brings equal ids together in index order, the head of each run is its first
    member; device ops only (no torch.unique, whose output size would need a host sync on GPU)."""
    b = group_ids.numel()
    sorted_ids, perm = torch.sort(group_ids, stable=True)
    head = torch.ones(b, dtype=torch.bool, device=group_ids.device)
    head[1:] = sorted_ids[1:] != sorted_ids[:-1]
    pos = torch.arange(b, device=group_ids.device)
    head_pos = torch.cummax(torch.where(head, pos, 0), 0).values
    rep = torch.empty_like(perm)
    rep[perm] = perm[head_pos]
    return rep


def _batch_std(r: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """[1] unbiased std of all rewards (1 for a batch of one), in the accumulation dtype."""
    if r.numel() <= 1:
        return torch.ones(1, dtype=acc, device=r.device)
    return r.to(acc).std().reshape(1)


def _tile_elements() -> int:
    """Rewards per program of the contiguous kernel: 4096 on a GPU (32 fp32 registers per thread with 4
    warps); the interpreter runs one numpy op per tile, so bigger is faster there."""
    return 1 << 16 if triton_interpreting() else 4096


def group_advantages_forward(
    rewards: torch.Tensor, group_ids: torch.Tensor | None, group_size: int, mode: str, eps: float
) -> torch.Tensor:
    """rewards [B] -> advantages [B] (same dtype), groups from group_ids [B] or contiguous group_size."""
    dtype = rewards.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    acc_tl = tl.float64 if acc == torch.float64 else tl.float32
    r = rewards.contiguous()
    b = r.numel()
    out = torch.empty(r.shape, dtype=store_dtype(dtype), device=r.device)
    if b == 0:
        return out.to(dtype)
    code = GROUP_MODE_CODES[mode]
    bstd = _batch_std(r, acc) if mode == "batch" else torch.ones(1, dtype=acc, device=r.device)
    if group_ids is None and group_size <= MAX_TILE_GROUP:
        block_n = next(w for w in GROUP_BLOCKS if w >= group_size)
        block_g = max(1, _tile_elements() // block_n)
        num_groups = b // group_size
        # Tiles past 4096 elements (groups > 4096) spread over more warps to bound registers per thread.
        warps = min(16, max(4, block_g * block_n // 1024))
        _contiguous_kernel[(triton.cdiv(num_groups, block_g),)](
            r,
            out,
            bstd,
            num_groups,
            group_size,
            *split3(eps),
            MODE=code,
            ACC=acc_tl,
            BLOCK_G=block_g,
            BLOCK_N=block_n,
            num_warps=warps,
        )
        return out.to(dtype)
    if group_ids is None:
        rep = torch.arange(b, device=r.device) // group_size * group_size
    else:
        rep = group_representatives(group_ids)
    stats = torch.zeros((3, b), dtype=torch.float64, device=r.device)  # see the module docstring
    count, sums, m2 = stats.unbind(0)
    block = elementwise_block(b)
    grid = (triton.cdiv(b, block),)
    _sums_kernel[grid](r, rep, count, sums, b, BLOCK=block)
    _m2_kernel[grid](r, rep, count, sums, m2, b, BLOCK=block)
    _finish_kernel[grid](
        r, rep, count, sums, m2, out, bstd, b, *split3(eps), MODE=code, ACC=acc_tl, BLOCK=block
    )
    return out.to(dtype)


def compile_cases():
    """Every mode x dtype x group width of the one-tile kernel (covering design plus every dtype x width at
    the heaviest mode), the representative path (group ids, groups wider than a tile), and size classes
    (rlkernels/triton/_specializations.py)."""
    rows = covering(
        features={
            "mode": tuple(GROUP_MODE_CODES),
            "path": ("tile", "ids", "wide"),
            "size": ("aligned", "odd"),
            "dtype": FLOAT_DTYPES,
        },
        resources={"dtype": FLOAT_DTYPES, "width": GROUP_BLOCKS},
        heaviest={"mode": "batch", "path": "tile", "size": "odd"},
    )
    for row, _ in rows:
        width = row["width"]
        # A group of `width`, or of one less (odd; padded to `width`); 64 groups (odd: 63).
        group = width - 1 if row["size"] == "odd" else width
        if row["path"] == "wide":
            group = MAX_TILE_GROUP + 1
        groups = 63 if row["size"] == "odd" else 64
        rewards = meta(group * groups, dtype=row["dtype"])
        ids = meta(group * groups, dtype=torch.int64) if row["path"] == "ids" else None
        label = ",".join(str(v) for v in row.values()).replace("torch.", "")
        yield CompileCase(
            f"group_advantages_forward[{label}]",
            functools.partial(group_advantages_forward, rewards, ids, group, row["mode"], 1e-6),
        )
