"""The tables of kernel specializations: what each Triton launcher can hand the compiler.

A Triton kernel is compiled once per specialization: its constexpr values (options, block sizes), the
element types of its pointers and its autotune config. Each launcher module declares the finite sets it
picks from (e.g. `TOKEN_BLOCKS`, the GEMM tiles of `_gemm.py`) and uses them itself, and exports
`compile_cases()`: the launcher calls, on meta tensors, that together produce every specialization the
launcher can produce (or, where the product of independent options is too large to compile, a covering
design of it, below). `python -m rlkernels compile-check` runs those calls with every launch turned into a
compile for a real GPU target (rlkernels/compile_check/), so the check covers exactly what the launchers
run, through their own argument binding. docs/compile_check.md has the whole story.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

# Every float dtype a launcher accepts (fp64 serves gradchecks).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclasses.dataclass(frozen=True)
class CompileCase:
    """One launcher call of the compile check: `run()` calls the launcher on meta tensors. An autotuned
    kernel compiles every tile its pruning keeps for the target when `all_configs`, else only the first
    (rows of a covering design that vary options, not resources)."""

    label: str
    run: Callable[[], object]
    all_configs: bool = True


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized tensor of `shape` on the meta device: launchers allocate and slice as they would on
    a GPU; only the compile-only launch sees it."""
    return torch.empty(shape, dtype=dtype, device="meta")


def full(axes: Mapping[str, Sequence]) -> Iterator[dict]:
    """Every combination of the axes' values (the full product)."""
    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        yield dict(zip(names, values, strict=True))


def pairwise(axes: Mapping[str, Sequence], *, candidates: int = 24) -> list[dict]:
    """A covering design of strength 2: rows in which every pair of values of any two axes appears
    together at least once (so every single value does too). Greedy (AETG): each new row is the best of
    `candidates` rows built value by value to cover the most uncovered pairs; deterministic.

    Why pairs: a specialization fails to compile because of one option, or of two interacting (a branch of
    one option that assumes another); with ~10 independent options the full product is tens of
    thousands of compiles, a covering design a few dozen."""
    names = list(axes)
    if len(names) < 2:
        return list(full(axes))
    uncovered = {
        (a, va, b, vb)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        for va in range(len(axes[a]))
        for vb in range(len(axes[b]))
    }
    rows: list[dict[str, int]] = []
    step = 0
    while uncovered:
        best, best_gain = None, -1
        for c in range(candidates):
            # A seed pair that is still uncovered anchors the row; the other axes are filled greedily,
            # in an order that varies between candidates.
            a, va, b, vb = sorted(uncovered)[(step * 7 + c * 13) % len(uncovered)]
            row = {a: va, b: vb}
            order = [n for n in names if n not in row]
            order = order[c % max(1, len(order)) :] + order[: c % max(1, len(order))]
            for n in order:
                row[n] = max(range(len(axes[n])), key=lambda v, n=n: _gain(row | {n: v}, uncovered, names))
            gain = _gain(row, uncovered, names)
            if gain > best_gain:
                best, best_gain = row, gain
        rows.append(best)
        uncovered -= _pairs(best, names)
        step += 1
    return [{n: axes[n][row[n]] for n in names} for row in rows]


def covering(features: Mapping[str, Sequence], resources: Mapping[str, Sequence], heaviest: Mapping) -> list:
    """Rows of a launcher's compile cases, each (dict, is_resource_row):
    - every pair of values of any two `features` (`pairwise`), with each resource axis that is not a
      feature at its last value (the largest block);
    - every combination of the `resources` axes (dtype, block size: what sets registers and shared
      memory) with the features at `heaviest` (every option on: the most registers)."""
    rows = []
    for r in pairwise(features):
        rows.append(({**{k: v[-1] for k, v in resources.items() if k not in r}, **r}, False))
    rows += [({**heaviest, **r}, True) for r in full(resources)]
    return rows


def _pairs(row: Mapping[str, int], names: Sequence[str]) -> set:
    present = [n for n in names if n in row]
    return {(a, row[a], b, row[b]) for i, a in enumerate(present) for b in present[i + 1 :]}


def _gain(row: Mapping[str, int], uncovered: set, names: Sequence[str]) -> int:
    return len(_pairs(row, names) & uncovered)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
