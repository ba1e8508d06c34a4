// The zeroed counter of last_block (csrc/cuda/last_block.cuh) for the launches of a binding: one int32 per
// device and stream, made once (one memset, the first time) and kept; every launch leaves it at zero, so no
// call builds a tensor for it. The twin of rlkernels/triton/_finish.py launch_counter.
#pragma once

#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

namespace rlk {

inline unsigned int* launch_counter(const at::Tensor& like) {
  static std::mutex mutex;
  // Never destroyed: the tensors must not be freed after the CUDA allocator at exit.
  static auto* counters = new std::map<std::pair<int, uintptr_t>, at::Tensor>();
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(like.device().index());
  const std::pair<int, uintptr_t> key{int(like.device().index()), reinterpret_cast<uintptr_t>(stream.stream())};
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = counters->find(key);
  if (it == counters->end()) {
    it = counters->emplace(key, at::zeros({1}, like.options().dtype(at::kInt))).first;
  }
  return static_cast<unsigned int*>(it->second.mutable_data_ptr());
}

}  // namespace rlk
