"""The GPU targets the compile check builds for, and a Triton driver that stands in for a real GPU of one.

The properties are the per-block limits a launch on that GPU is held to (CUDA occupancy calculator /
cudaDeviceProp): `max_shared_mem` is the opt-in maximum of dynamic shared memory per block, the number
Triton's launcher checks before it launches.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
    arch: int  # compute capability x 10
    name: str
    max_shared_mem: int  # bytes per block (opt-in)
    multiprocessor_count: int
    max_num_regs: int = 65536  # 32-bit registers per block
    warp_size: int = 32


TARGETS = {
    80: Target(80, "A100 (sm_80)", max_shared_mem=166_912, multiprocessor_count=108),
    90: Target(90, "H100 (sm_90)", max_shared_mem=232_448, multiprocessor_count=132),
}


class _Utils:
    def __init__(self, target: Target):
        self._target = target

    def get_device_properties(self, device):
        t = self._target
        return {
            "max_shared_mem": t.max_shared_mem,
            "multiprocessor_count": t.multiprocessor_count,
            "max_num_regs": t.max_num_regs,
            "warpSize": t.warp_size,
        }


class OfflineDriver:
    """The part of Triton's active driver that compiling (not launching) a kernel consults: the current
    target, device and stream, and the device properties (read by autotune pruning, rlkernels/triton/
    _gemm.py). Installed with `triton.runtime.driver.set_active` by rlkernels/compile_check/launch.py."""

    def __init__(self, target: Target):
        from triton.backends.compiler import GPUTarget

        self.target = target
        self.utils = _Utils(target)
        self._gpu_target = GPUTarget("cuda", target.arch, target.warp_size)

    def get_current_target(self):
        return self._gpu_target

    def get_current_device(self):
        return self.target.arch  # a device id per target: Triton keeps one kernel cache per device

    def get_current_stream(self, device=None):
        return 0

    def is_active(self):
        return True
