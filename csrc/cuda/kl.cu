// kl_penalty CUDA kernels: grid-stride elementwise loops over the shared math in rlkernels/kl.h, in 16-byte packs.
#include <algorithm>

#include "common.cuh"
#include "kl.h"
#include "rlkernels/kl.h"

namespace rlk {
namespace cuda {
namespace {

// A call is `rows` rows of n elements (kl.h): a flat call one row; block row blockIdx.y takes rows blockIdx.y,
// blockIdx.y + gridDim.y, ... The grid-stride loops along a row go over 16-byte packs (common.cuh) when every
// row of every pointer starts 16-byte aligned (`packed`; the host checks it), then over what is left one
// element a thread: all of it when not packed, else the tail after the last whole pack. A thread's packs of
// both inputs are loaded before it computes.
template <typename T>
__global__ void kl_forward_kernel(Rows<T> logp_rows,  // [rows, n]
                                  Rows<T> ref_rows,   // [rows, n]
                                  T* __restrict__ out_rows,  // [rows, n] contiguous
                                  int64_t rows, int64_t n, bool packed, KLKind kind, typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  constexpr int P = kPack<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? n / P : 0;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* __restrict__ logp = logp_rows.row(r);
    const T* __restrict__ ref = ref_rows.row(r);
    T* __restrict__ out = out_rows + r * n;
    const auto* lp = reinterpret_cast<const Pack<T>*>(logp);
    const auto* rp = reinterpret_cast<const Pack<T>*>(ref);
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<T> a = lp[p], b = rp[p];
      Pack<T> o;
#pragma unroll
      for (int i = 0; i < P; ++i) o.v[i] = from_acc<T>(kl_value<A>(kind, to_acc(a.v[i]), to_acc(b.v[i]), clamp));
      reinterpret_cast<Pack<T>*>(out)[p] = o;
    }
    for (int64_t i = packs * P + first; i < n; i += stride) {
      out[i] = from_acc<T>(kl_value<A>(kind, to_acc(logp[i]), to_acc(ref[i]), clamp));
    }
  }
}

// d logp and its negative d ref_logp in one pass (a null output is not written), over rows as the forward;
// grad is read at g_stride (0: one element broadcast, the gradient of `.sum()`; 1: contiguous [rows, n]).
template <typename T>
__global__ void kl_backward_kernel(const T* __restrict__ grad_rows,  // [rows, n] at g_stride
                                   Rows<T> logp_rows,                // [rows, n]
                                   Rows<T> ref_rows,                 // [rows, n]
                                   T* __restrict__ grad_logp_rows,   // [rows, n] contiguous, or nullptr
                                   T* __restrict__ grad_ref_rows,    // [rows, n] contiguous, or nullptr
                                   int64_t rows, int64_t n, int64_t g_stride, bool packed, KLKind kind,
                                   typename Acc<T>::type clamp) {
  using A = typename Acc<T>::type;
  constexpr int P = kPack<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? n / P : 0;
  const A g0 = g_stride == 0 ? to_acc(grad_rows[0]) : A(0);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* __restrict__ grad = grad_rows + r * n * g_stride;
    const T* __restrict__ logp = logp_rows.row(r);
    const T* __restrict__ ref = ref_rows.row(r);
    T* __restrict__ grad_logp = grad_logp_rows == nullptr ? nullptr : grad_logp_rows + r * n;
    T* __restrict__ grad_ref = grad_ref_rows == nullptr ? nullptr : grad_ref_rows + r * n;
    const auto* lp = reinterpret_cast<const Pack<T>*>(logp);
    const auto* rp = reinterpret_cast<const Pack<T>*>(ref);
    const auto* gp = reinterpret_cast<const Pack<T>*>(grad);
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<T> a = lp[p], b = rp[p];
      Pack<T> gs;
      if (g_stride != 0) gs = gp[p];
      Pack<T> dl, dr;
#pragma unroll
      for (int i = 0; i < P; ++i) {
        const A g =
            (g_stride == 0 ? g0 : to_acc(gs.v[i])) * kl_grad<A>(kind, to_acc(a.v[i]), to_acc(b.v[i]), clamp);
        dl.v[i] = from_acc<T>(g);
        dr.v[i] = from_acc<T>(-g);
      }
      if (grad_logp != nullptr) reinterpret_cast<Pack<T>*>(grad_logp)[p] = dl;
      if (grad_ref != nullptr) reinterpret_cast<Pack<T>*>(grad_ref)[p] = dr;
    }
    for (int64_t i = packs * P + first; i < n; i += stride) {
      const A g = to_acc(grad[i * g_stride]) * kl_grad<A>(kind, to_acc(logp[i]), to_acc(ref[i]), clamp);
      if (grad_logp != nullptr) grad_logp[i] = from_acc<T>(g);
      if (grad_ref != nullptr) grad_ref[i] = from_acc<T>(-g);
    }
  }
}

// Each row of each pointer 16-byte aligned: its start, and its row stride in bytes (a flat call's one row
// has none).
bool rows_packs_aligned(std::initializer_list<RowsArg> ptrs, int64_t rows, size_t elem) {
  for (const RowsArg& a : ptrs) {
    if (a.data != nullptr && rows > 1 && (a.ld * int64_t(elem)) % 16 != 0) return false;
  }
  for (const RowsArg& a : ptrs) {
    if (!packs_aligned({a.data})) return false;
  }
  return true;
}

// (blocks along a row, block rows): a flat call's grid as before; rows share the grid-stride cap.
dim3 rows_grid(int64_t rows, int64_t units) {
  const unsigned int y = static_cast<unsigned int>(rows < 65535 ? (rows < 1 ? 1 : rows) : 65535);
  int64_t x = elementwise_blocks(units);
  if (y > 1) x = std::max<int64_t>(1, std::min<int64_t>(x, kMaxElementwiseBlocks / y));
  return dim3(static_cast<unsigned int>(x), y);
}

}  // namespace

cudaError_t kl_penalty_forward(DType dtype, RowsArg logp, RowsArg ref, void* out, int64_t rows, int64_t n, int kind,
                               double clamp, cudaStream_t stream) {
  if (n == 0 || rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const bool packed = rows_packs_aligned({logp, ref, RowsArg{out, n}}, rows, sizeof(T));
    kl_forward_kernel<T><<<rows_grid(rows, packed ? n / kPack<T> + n % kPack<T> : n), kElementwiseThreads, 0,
                           stream>>>(rows_of<T>(logp), rows_of<T>(ref), static_cast<T*>(out), rows, n, packed,
                                     KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

cudaError_t kl_penalty_backward(DType dtype, const void* grad, int64_t grad_stride, RowsArg logp, RowsArg ref,
                                void* grad_logp, void* grad_ref, int64_t rows, int64_t n, int kind, double clamp,
                                cudaStream_t stream) {
  if (n == 0 || rows == 0) return cudaSuccess;
  RLK_CUDA_DISPATCH_FLOATING(dtype, T, {
    using A = typename Acc<T>::type;
    const bool packed = (grad_stride == 0 || grad_stride == 1) &&
                        rows_packs_aligned({RowsArg{grad_stride == 0 ? nullptr : grad, n}, logp, ref,
                                            RowsArg{grad_logp, n}, RowsArg{grad_ref, n}},
                                           rows, sizeof(T));
    kl_backward_kernel<T><<<rows_grid(rows, packed ? n / kPack<T> + n % kPack<T> : n), kElementwiseThreads, 0,
                            stream>>>(static_cast<const T*>(grad), rows_of<T>(logp), rows_of<T>(ref),
                                      static_cast<T*>(grad_logp), static_cast<T*>(grad_ref), rows, n, grad_stride,
                                      packed, KLKind(kind), A(clamp));
  });
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rlk
