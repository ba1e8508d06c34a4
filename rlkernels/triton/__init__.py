"""@triton.jit kernels and their launchers (no autograd here; see rlkernels/ops/)."""
