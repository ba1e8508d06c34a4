"""Every public op's GPU branch, run on fake CUDA tensors: the GPU dispatch path checked on a machine
without a GPU (docs/testing.md, "The GPU paths on fake CUDA tensors").

`torch._subclasses.fake_tensor.FakeTensorMode` gives tensors that claim to live on "cuda" and carry only
metadata. An op called on them runs its real Python code, the validation, the backend selection, the
launcher's glue around the kernels, and then each custom op's fake kernel (its `register_fake`) in place of
the kernel. So a fake run checks, for `backend="auto"`, `"triton"` and `"cuda"`:
- that validation and backend selection accept a GPU call;
- that it makes no host sync (a `.item()`, a data-dependent shape, a copy to the CPU or a blocking one from
  it) beyond its stated budget (`calls.SYNC_BUDGET`, `host_syncs.HostSyncs`);
- that the outputs (and the gradients of a backward through the ops' autograd formulas, walked from Python:
  `autograd_walk`) have the shapes and dtypes the reference gives on real CPU tensors, and live on the GPU;
- with `dynamo=True`, that `torch._dynamo.export` captures the call as one graph
  (`torch.compile(fullgraph=True)` on a GPU takes the same trace). Run it in a fresh process
  (`python -m rlkernels fake-cuda --dynamo`), so that a first call inside a graph is covered too.

What it cannot see: the kernels themselves (their numbers, races, launch limits), and anything a fake
kernel gets wrong in the same way as its op (the oracle tests on a GPU check those).

    python -m rlkernels fake-cuda [--backends auto triton cuda] [--dynamo] [--only NAME ...]
"""

from rlkernels.fake_cuda.autograd_walk import walk_backward
from rlkernels.fake_cuda.calls import CALLS, EAGER_ONLY, GPU_BACKENDS, SYNC_BUDGET, Maker
from rlkernels.fake_cuda.check import check_call, check_dynamo, fake_cuda_mode, main, run_fake
from rlkernels.fake_cuda.host_syncs import HostSyncs, placing_inputs

__all__ = [
    "CALLS",
    "EAGER_ONLY",
    "GPU_BACKENDS",
    "SYNC_BUDGET",
    "HostSyncs",
    "placing_inputs",
    "Maker",
    "check_call",
    "check_dynamo",
    "fake_cuda_mode",
    "main",
    "run_fake",
    "walk_backward",
]
