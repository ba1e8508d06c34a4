// The bindings' side of rows.h: a [B, T] (or [B]) input as the token kernels that take a row stride read it.
// Not in the kernels' headers: a .cu that includes torch headers takes minutes to compile.
#pragma once

#include <ATen/core/Tensor.h>

#include "rows.h"

namespace rlk {

// t as it is when each row's elements are adjacent, whatever the rows' stride (verl's response_mask,
// attention_mask[:, -T:], and its log-probs and entropy sliced out of the padded sequence are such views; an
// expanded row has stride 0), else a contiguous copy. Element (b, t) is then at data + b * stride(0) + t.
inline at::Tensor unit_columns(const at::Tensor& t) {
  return t.dim() < 2 || t.size(1) <= 1 || t.stride(1) == 1 ? t : t.contiguous();
}

// The launchers' view of such a tensor (unit_columns' result): its data at its row stride; {nullptr, 0} for an
// undefined one (an input the call does not have).
inline cuda::RowsArg rows_arg(const at::Tensor& t) {
  return t.defined() ? cuda::RowsArg{t.const_data_ptr(), t.stride(0)} : cuda::RowsArg{nullptr, 0};
}

}  // namespace rlk
