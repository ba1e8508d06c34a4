// The group representatives of arbitrary ids on CUDA tensors (a stable sort: device ops, no host sync,
// unlike torch.unique), for the bindings of group_advantages, grpo_passk and opo.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cummax.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

namespace rlk {

// ids [b] -> [b] int64, the index of the first element with the same id: a stable sort brings equal ids
// together in index order, the head of each run is the group's first member.
inline at::Tensor group_representatives(const at::Tensor& ids) {
  const int64_t b = ids.numel();
  const auto sorted = at::sort(ids, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor& keys = std::get<0>(sorted);
  const at::Tensor& perm = std::get<1>(sorted);
  at::Tensor head = at::ones({b}, ids.options().dtype(at::kBool));
  if (b > 1) head.slice(0, 1).copy_(keys.slice(0, 1) != keys.slice(0, 0, b - 1));
  const at::Tensor pos = at::arange(b, ids.options().dtype(at::kLong));
  const at::Tensor head_pos = std::get<0>(at::cummax(at::where(head, pos, at::zeros_like(pos)), 0));
  at::Tensor rep = at::empty_like(perm);
  rep.scatter_(0, perm, perm.index_select(0, head_pos));
  return rep;
}

}  // namespace rlk
