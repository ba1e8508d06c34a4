"""A/B on a GPU (the 2026-11-30 lease, README.md beside it): the Triton logits kernels with and without fp
fusion (rlkernels/triton/_softmax.py UNFUSED), interleaved in one process. From the repository root."""

import sys

sys.path.insert(0, "benchmarks")
import graph_replay  # noqa: E402

from rlkernels.triton import _softmax  # noqa: E402

for r in range(2):
    for fused in (True, False):
        _softmax.UNFUSED["enable_fp_fusion"] = fused
        print(f"round {r} enable_fp_fusion={fused}", flush=True)
        graph_replay.main(
            ["--ops", "logprobs_from_logits", "--providers", "rlkernels[[]triton[]]", "--calls", "30"]
        )
