// Shim of CUDA's cuda_runtime_api.h for the cuda-on-cpu harness (tests/cuda_on_cpu): the host API only.
#pragma once

#include "rlk_sim/api.h"
