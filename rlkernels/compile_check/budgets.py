"""What a compiled kernel may use, beyond the hardware's per-block limits (targets.py).

Spills: register values ptxas moves to the per-thread stack frame (local memory, cached in L1).
"""

# Triton kernels: at most 8 spilled 32-bit values per thread. That many round-trips through L1 cost little
# next to a tile's operand traffic (32 B x 256 threads = 8 KiB per block, well inside the L1 left beside
# the shared-memory carve-out); more means the tile does not fit the register file and must be pruned or
# reshaped (the compile check found 700-1700 B for 128x256 bf16 tiles and ~10 KB for fp32 `ieee` tiles).
TRITON_SPILL_BYTES = 32
# fp64 specializations serve gradchecks on small inputs, where speed does not matter; a value takes two
# registers, so the reductions over 4096-element tiles spill a little (the compile check saw 96-256 B).
TRITON_FP64_SPILL_BYTES = 256

# CUDA C++ kernels: no spills in the instantiations users run (fp32, bf16, fp16): every kernel is a
# register-light loop or reduction, so a spill there is a code-generation regression. fp64 instantiations
# serve gradchecks on small inputs, where speed does not matter; they may spill this much.
CUDA_SPILL_BYTES = 0
CUDA_FP64_SPILL_BYTES = 256

# CUDA C++ kernels are launched with at most 256 threads per block (__launch_bounds__ or the launchers'
# constants); 128 registers per thread keeps two such blocks resident per SM (65536 registers / SM).
CUDA_MAX_REGISTERS = 128
