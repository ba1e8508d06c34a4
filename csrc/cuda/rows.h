// A token kernel's input at a row stride of its own, as the launchers take it (rows_host.h unit_columns: a
// view such as attention_mask[:, -T:] is read where it lies, no copy). The kernels' typed view is common.cuh
// Rows<E>.
#pragma once

#include <stdint.h>

namespace rlk {
namespace cuda {

// Element (b, t) of a [B, T] input at data[b * ld + t]; element b of a [B] input at data[b * ld]. data is null
// for an input the call does not have.
struct RowsArg {
  const void* data;
  int64_t ld;
};

}  // namespace cuda
}  // namespace rlk
