// Shim of CUDA's cuda_runtime.h for the cuda-on-cpu harness (tests/cuda_on_cpu): the host API, the device
// builtins and intrinsics, and the launch that <<<...>>> is rewritten into. Like nvcc, the harness includes
// it first in every .cu it compiles.
#pragma once

#include "rlk_sim/api.h"
#include "rlk_sim/device.h"
#include "rlk_sim/half.h"
