// Shim of CUDA's cuda_bf16.h for the cuda-on-cpu harness: __nv_bfloat16 storage and conversions
// (rlk_sim/half.h).
#pragma once

#include "rlk_sim/half.h"
