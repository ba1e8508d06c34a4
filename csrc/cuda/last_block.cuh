// One launch, whole answer: a reduction whose last block finishes it (docs/gpu_token_ops.md), the CUDA twin of
// rlkernels/triton/_finish.py. Instead of a second launch, or ATen ops on [B]-sized partials, every block
// writes its partials, then takes a ticket from a counter; the block that draws the last ticket has seen every
// other block's partials and finishes the reduction in the same launch:
//
//     partials[blockIdx.x * K + k] = ...;          // plain stores
//     if (last_block(counter, gridDim.x)) {        // every thread of every block calls it
//       ... load_partial(partials + i) over all blocks, in a fixed order (deterministic) ...
//     }
//
// The counter (csrc/cuda/launch_counter.h) is one zeroed word per device and stream, left at zero by every
// launch (the last block resets it): no launch needs a memset, and launches on one stream run in order.
// Torch-free.
#pragma once

#include <cuda_runtime.h>

namespace rlk {
namespace cuda {

// True in every thread of exactly one block: the last of the launch's `total` blocks to get here. Each thread's
// earlier global stores are made visible device-wide (fence) before the block's ticket is taken, so the last
// block sees every block's partials; it also resets the counter. Every thread of the block must call it (it
// synchronizes the block), once per launch.
__device__ __forceinline__ bool last_block(unsigned int* counter, unsigned int total) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int ticket = atomicAdd(counter, 1u);
    is_last = ticket == total - 1;
    if (is_last) atomicExch(counter, 0u);
  }
  __syncthreads();
  const bool last = is_last;
  if (last) __threadfence();  // the other blocks' partials are read after the ticket
  return last;
}

// Another block's partial, read past this SM's L1 (which may hold a stale line of it).
template <typename A>
__device__ __forceinline__ A load_partial(const A* p) {
  return *static_cast<const volatile A*>(p);
}

}  // namespace cuda
}  // namespace rlk
