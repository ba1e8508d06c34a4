// What the CPU advantage and GAE kernels (advantages.cpp, gae.cpp) share on the host: a token mask's data
// pointer by its type, and the validity flag they return.
//
// Internal linkage on purpose, as row_loops.h: each kernel file instantiates its own.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/scalar_tensor.h>
#include <stdint.h>

namespace rlk {
namespace {

// Calls f(mask_ptr) with the mask as bool*, int64_t* or A* (the kinds the scans and the token advantages
// read: float weights in the accumulation type A; the public functions convert other dtypes first).
template <typename A, typename F>
void with_mask(const at::Tensor& mask, F&& f) {
  if (mask.scalar_type() == at::kBool) {
    f(mask.const_data_ptr<bool>());
  } else if (mask.scalar_type() == at::kLong) {
    f(mask.const_data_ptr<int64_t>());
  } else {
    f(mask.const_data_ptr<A>());
  }
}

// The op's validity flag (its last output): a 0-dim bool, true when the kernel rejected no input value.
inline at::Tensor ok_flag(int64_t bad, const at::Tensor& like) {
  return at::scalar_tensor(bad == 0, like.options().dtype(at::kBool));
}

}  // namespace
}  // namespace rlk
