"""On a GPU: policy_loss's Triton forward kernel at the bench's largest shape (B=512 T=8192, every per-token
term on), its tokens per program and warps swept, against the CUDA C++ forward: each kernel's device time
from the profiler (benchmarks/kernel_times.py), so host work does not hide it.

The 2026-11-27 H200 trace had this forward, then 1024 tokens and 4 warps a program, at 98 us for ~105 MB
(about 1.1 TB/s), where value_loss's, with the same finishing program, streamed at 2 TB/s; this sweep set
policy_loss.FORWARD_BLOCK and FORWARD_WARPS.

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

VARIANTS = [(1024, 4), (1024, 8), (2048, 4), (2048, 8), (4096, 8), (8192, 8)]  # (tokens per program, warps)


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    B, T = (512, 8192) if device.type == "cuda" else (4, 256)
    x = _policy_inputs(B, T, torch.float32, device)()
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "none (CPU: the steps only)"
    print(f"policy_forward_sweep: B={B} T={T} fp32 on {gpu}; device us per call of the forward kernels")

    def forward(backend):
        return lambda: rk.policy_loss(**x, **POLICY_KW, backend=backend)

    def kernels(row):
        return {k: v for k, v in row["kernels"].items() if "forward" in k or "seq_log_ratio" in k}

    rows = {"cuda flavor": lambda: forward("cuda")} if device.type == "cuda" else {}
    for block, warps in VARIANTS:
        rows[f"triton block={block} warps={warps}"] = (block, warps)
    for name, variant in rows.items():
        if callable(variant):
            step = variant()
            row = profile_step(step, device, calls=50, warmup=5)
        else:
            block, warps = variant
            with mock.patch.object(tpl, "_forward_tile", lambda T, b=block, w=warps: (b, w)):
                row = profile_step(forward("triton"), device, calls=50, warmup=5)
        found = kernels(row)
        us = sum(s for _, s in found.values()) * 1e6
        print(
            f"  {name:32s} {us:8.1f} us  ({', '.join(k[:40] for k in found) or 'no device kernels'})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
