// c10::cuda::CUDAGuard for the CUDA bindings compiled by the cuda-on-cpu harness: the tensors live on the
// CPU, so there is no device to switch to.
#pragma once

#include <c10/core/Device.h>

namespace c10 {
namespace cuda {

struct CUDAGuard {
  explicit CUDAGuard(c10::Device) {}
  CUDAGuard(const CUDAGuard&) = delete;
  CUDAGuard& operator=(const CUDAGuard&) = delete;
};

}  // namespace cuda
}  // namespace c10
