"""The cuda-on-cpu harness: csrc/cuda's kernels and bindings compiled by the host compiler and run on CPU
tensors, each CUDA thread a fiber (docs/testing.md)."""
