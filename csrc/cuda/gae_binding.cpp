// gae / discounted_returns on CUDA tensors: checks, stream and device guard, then the torch-free launchers in
// gae.cu. The input values (cu_seqlens included) are checked by the kernels, which return a validity flag:
// no host sync (the Python API asserts it asynchronously), and the kernels clamp every row to the tensor.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "gae.h"
#include "launch_counter.h"
#include "rlkernels/gae_host.h"

namespace rlk {
namespace {

cuda::ScanMask scan_mask(const at::Tensor& m) {
  if (m.scalar_type() == at::kBool) return cuda::ScanMask::Bool;
  return m.scalar_type() == at::kLong ? cuda::ScanMask::Int64 : cuda::ScanMask::Float;
}

// The arguments every scan launch shares, with its scratch (row partials), flag and coefficients allocated.
struct Scan {
  at::Tensor r, m, cu, parts, coef, ok;
  cuda::ScanArgs args{};

  Scan(const ScanLayout& layout, const at::Tensor& rewards, const at::Tensor& mask,
       const std::optional<at::Tensor>& cu_seqlens, int kind, bool whiten, double gamma, double gamma_lam)
      : r(rewards.contiguous()), m(mask.contiguous()) {
    if (cu_seqlens.has_value()) cu = cu_seqlens->contiguous();
    const auto acc = r.options().dtype(acc_scalar_type(r.scalar_type()));
    parts = at::empty({layout.rows > 0 ? layout.rows : 1, 4}, acc);
    coef = at::empty({2}, acc);
    ok = at::empty({}, r.options().dtype(at::kBool));
    args.kind = kind;
    args.whiten = whiten;
    args.mask_kind = scan_mask(m);
    args.rows = {cu.defined() ? cu.const_data_ptr() : nullptr, cu.defined() && cu.scalar_type() == at::kLong,
                 layout.rows, layout.row_len, r.numel()};
    args.rewards = r.const_data_ptr();
    args.values = r.const_data_ptr();  // returns read no values
    args.mask = m.const_data_ptr();
    args.baseline = nullptr;
    args.parts = parts.mutable_data_ptr();
    args.counter = launch_counter(r);
    args.coef = coef.mutable_data_ptr();
    args.ok = ok.mutable_data_ptr<bool>();
    args.gamma = gamma;
    args.gamma_lam = gamma_lam;
  }

  void launch(const char* op) const {
    const cudaError_t err = cuda::scan_forward(to_dtype(r), args, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> gae_cuda(const at::Tensor& rewards, const at::Tensor& values,
                                                        const at::Tensor& mask,
                                                        const std::optional<at::Tensor>& cu_seqlens, double gamma,
                                                        double lam, bool whiten) {
  constexpr const char* op = "rlkernels::gae";
  const ScanLayout layout = check_scan_inputs(op, rewards, &values, mask, cu_seqlens);
  const c10::cuda::CUDAGuard guard(rewards.device());
  Scan scan(layout, rewards, mask, cu_seqlens, int(ScanKind::GAE), whiten, gamma, gamma * lam);
  const at::Tensor v = values.contiguous();
  at::Tensor adv = at::empty(scan.r.sizes(), scan.r.options()), ret = at::empty(scan.r.sizes(), scan.r.options());
  scan.args.values = v.const_data_ptr();
  scan.args.out = adv.mutable_data_ptr();
  scan.args.second = ret.mutable_data_ptr();
  scan.launch(op);
  return {adv, ret, scan.ok};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> discounted_returns_cuda(const at::Tensor& rewards,
                                                                       const at::Tensor& mask,
                                                                       const std::optional<at::Tensor>& cu_seqlens,
                                                                       double gamma,
                                                                       const std::optional<at::Tensor>& baseline,
                                                                       bool whiten) {
  constexpr const char* op = "rlkernels::discounted_returns";
  const ScanLayout layout = check_scan_inputs(op, rewards, nullptr, mask, cu_seqlens, baseline);
  TORCH_CHECK(!(whiten && baseline.has_value()), op, ": whiten and baseline are exclusive");
  const c10::cuda::CUDAGuard guard(rewards.device());
  Scan scan(layout, rewards, mask, cu_seqlens, int(ScanKind::Returns), whiten, gamma, 0.0);
  const at::Tensor b = baseline.has_value() ? baseline->contiguous() : at::Tensor();
  at::Tensor out = at::empty(scan.r.sizes(), scan.r.options());
  at::Tensor second = at::empty(whiten || b.defined() ? scan.r.sizes() : at::IntArrayRef{0}, scan.r.options());
  scan.args.baseline = b.defined() ? b.const_data_ptr() : nullptr;
  scan.args.out = out.mutable_data_ptr();
  scan.args.second = second.numel() > 0 ? second.mutable_data_ptr() : nullptr;
  scan.launch(op);
  return {out, second, scan.ok};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CUDA, m) {
  m.impl("gae", &gae_cuda);
  m.impl("discounted_returns", &discounted_returns_cuda);
}

}  // namespace rlk
