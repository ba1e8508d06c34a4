// Shim of CUDA's cuda_fp16.h for the cuda-on-cpu harness: __half storage and conversions (rlk_sim/half.h).
#pragma once

#include "rlk_sim/half.h"
