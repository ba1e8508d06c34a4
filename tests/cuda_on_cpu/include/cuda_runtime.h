// Shim of CUDA's cuda_runtime.h for the cuda-on-cpu harness (tests/cuda_on_cpu): the host API, the device
// builtins and intrinsics, and the launch that <<<...>>> is rewritten into. Like nvcc, the harness includes
// it first in every .cu it compiles.
#pragma once

// What csrc/cuda tests to tell the harness from nvcc's host pass (common.cuh require_values).
#define RLK_CUDA_ON_CPU 1

#include "rlk_sim/api.h"
#include "rlk_sim/device.h"
#include "rlk_sim/half.h"
