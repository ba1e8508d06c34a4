"""On a GPU: policy_loss's Triton forward kernel at the bench's largest shape (B=512 T=8192, every per-token
term on), its tokens per program and warps swept, against the CUDA C++ forward: each kernel's device time
from the profiler (benchmarks/kernel_times.py), so host work does not hide it.

The 2026-11-27 H200 trace had this forward, then 1024 tokens and 4 warps a program, at 98 us for ~105 MB
(about 1.1 TB/s), where value_loss's, with the same finishing program, streamed at 2 TB/s; this sweep set
policy_loss.FORWARD_BLOCK and FORWARD_WARPS. The last variants keep that tile and change only the finishing
program's loads (rlkernels/triton/_aggregation.py finish_tile: rows and chunks a load): the same streaming
with 20, 40 and 160 dependent loads of L2 in the tail, which prices one such load (gpu_model.py
FINISH_LOAD_S). The "persistent" rows run the 2048x8 tile in policy_loss.FORWARD_PROGRAMS_PER_SM programs
an SM, each with its next tiles' loads in flight (gpu_model.py persistent_policy_report predicts it).
The "mask" rows run the default tile on the same tokens with the mask given as int64 (verl's) and as float
0/1 weights: the same bits as the bool mask's, but 125-128 registers a thread on sm_90 where the bool mask's
takes 80, 2 programs an SM where it has 3 (docs/gpu_token_ops.md, "A 0/1 mask's kept token weighs 1"): the
difference prices the third program.

    python benchmarks/policy_forward_sweep.py
"""

from __future__ import annotations

import pathlib
import sys
from unittest import mock

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_policy_loss import POLICY_KW, _policy_inputs  # noqa: E402
from kernel_times import profile_step  # noqa: E402

import rlkernels as rk  # noqa: E402
from rlkernels.triton import policy_loss as tpl  # noqa: E402

# (tokens per program, warps, the finishing program's (rows, chunks) a load or None for finish_tile's)
VARIANTS = [(2048, 8, None), (1024, 4, None), (1024, 8, None), (2048, 4, None), (4096, 8, None)]
VARIANTS += [(8192, 8, None), (2048, 8, (64, 1)), (2048, 8, (16, 1))]
# Programs an SM of the persistent forward (its 2048x8 tile).
PERSISTENT = (1, 2)
# The default tile's other mask dtypes (the bool mask's row is the tile's own).
MASK_DTYPES = (torch.int64, torch.float32)


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    B, T = (512, 8192) if device.type == "cuda" else (4, 256)
    x = _policy_inputs(B, T, torch.float32, device)()
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU: the steps only)"
    print(f"policy_forward_sweep: B={B} T={T} fp32 on {gpu}; device us per call of the forward kernels")

    def forward(backend, mask_dtype=torch.bool):
        inputs = dict(x, mask=x["mask"].to(mask_dtype))
        return lambda: rk.policy_loss(**inputs, **POLICY_KW, backend=backend)

    def kernels(row):
        return {k: v for k, v in row["kernels"].items() if "forward" in k or "seq_log_ratio" in k}

    rows = {"cuda flavor": lambda: forward("cuda")} if device.type == "cuda" else {}
    # The mask rows right after the program-per-tile row of the default tile, their comparison: the lease
    # gives this sweep 30 s, and a row cut by it is the last (the persistent rows, measured twice, last).
    persistent_rows = {}
    for block, warps, finish in VARIANTS:
        name = f"triton block={block} warps={warps}" + (f" finish={finish}" if finish else "")
        rows[name] = (block, warps, finish, None, torch.bool)
        if (block, warps, finish) == (tpl.FORWARD_BLOCK, tpl.FORWARD_WARPS, None):
            for dtype in MASK_DTYPES:
                rows[f"{name} mask={str(dtype).removeprefix('torch.')}"] = (block, warps, None, None, dtype)
            for n in PERSISTENT:
                persistent_rows[f"triton persistent, {n} an SM"] = (block, warps, None, n, torch.bool)
    for name, variant in {**rows, **persistent_rows}.items():
        if callable(variant):
            step = variant()
            row = profile_step(step, device, calls=50, warmup=5)
        else:
            block, warps, finish, programs, mask_dtype = variant
            tile = mock.patch.object(tpl, "_forward_tile", lambda T, b=block, w=warps: (b, w))
            own = (lambda *_, f=finish: f) if finish else tpl.finish_tile
            loads = mock.patch.object(tpl, "finish_tile", own)
            persistent = mock.patch.object(tpl, "FORWARD_PROGRAMS_PER_SM", programs)
            with tile, loads, persistent:
                row = profile_step(forward("triton", mask_dtype), device, calls=50, warmup=5)
        found = kernels(row)
        us = sum(s for _, s in found.values()) * 1e6
        print(
            f"  {name:42s} {us:8.1f} us  ({', '.join(k[:40] for k in found) or 'no device kernels'})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
