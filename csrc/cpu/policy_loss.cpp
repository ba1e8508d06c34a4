// policy_loss on CPU: one forward pass over the tokens producing the per-row masked sums (and, when asked,
// the per-token gradient d S_b / d logp), one backward pass writing d logp and d entropy.
//
// Work is split into (row, chunk) tasks of at most kChunk tokens; each task walks its chunk in blocks of
// kBlock tokens: the inputs of a block are converted to the accumulation type in L1-resident scratch
// arrays, then one branch-free loop (compiled per objective x KL kind, vectorized with the exp of
// vmath.h) computes every per-token term, and the block's sums are reduced in 16 lanes and added in fp64.
// Chunk partials are combined per row in a fixed order: results do not depend on the thread count.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "rlkernels/policy_loss_host.h"
#include "row_loops.h"

namespace rlk {
namespace {

// Conversion buffers of one block (used for fp16/bf16 inputs, bool masks and per-row constants) and its
// per-token results.
template <typename A>
struct Scratch {
  alignas(64) A lp[kBlock];
  alignas(64) A ol[kBlock];
  alignas(64) A m[kBlock];
  alignas(64) A adv[kBlock];
  alignas(64) A w[kBlock];
  alignas(64) A ref[kBlock];
  alignas(64) A ent[kBlock];
  alignas(64) A ratio[kBlock];  // level="sequence": the row's ratio, repeated (keeps every select per lane)
  alignas(64) A kl[kBlock];     // the KL term and its d/dlogp (zeros without KL)
  alignas(64) A dkl[kBlock];
  alignas(64) A wl[kBlock];  // m · L
  alignas(64) A wd[kBlock];  // m · dL/dlogp
  alignas(64) A st[kRowStats][kBlock];  // m · x for each stat column (kSeqLogRatio unused)
};

// The per-token inputs of one block in the accumulation type: the input tensors themselves where no
// conversion is needed (fp32 / fp64 inputs: no copy), else the scratch arrays they were converted into.
template <typename A>
struct BlockIn {
  const A *lp, *ol, *m, *adv, *w, *ref, *ent, *ratio;
};

template <typename A>
struct Hyper {
  PGParams<A> pg;
  A kl_coef, kl_clamp, entropy_coef;
};

// ---- block loops (plain functions over raw pointers so that gcc vectorizes them) ----

// The KL estimator's value and d/dlogp per token of a block, compiled per kind (vectorized). A loop of its
// own so that the policy loop is compiled per objective only.
template <typename A, KLKind K>
RLK_CPU_MULTIVERSION __attribute__((flatten)) void kl_block(const A* __restrict__ lp, const A* __restrict__ ref,
                                                            A clamp, A* __restrict__ kl, A* __restrict__ dkl,
                                                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    kl[i] = kl_value<A>(K, lp[i], ref[i], clamp);
    dkl[i] = kl_grad<A>(K, lp[i], ref[i], clamp);
  }
}

// Every per-token term of a block. SEQ: level="sequence" (r is the row's ratio, read from `ratio_` so that
// gcc vectorizes the selects on it; `seq_pass` says whether its clamp passes the gradient). STATS: the
// forward pass (m·L and the stat columns, and m·dL/dlogp); else the backward pass (m·dL/dlogp only).
// Masked tokens (m == 0) contribute exact zeros whatever their inputs hold (selects, not products, so a
// NaN or inf at padding never leaks). `flatten` inlines exp_ and the math of the headers, which the
// vectorizer needs.
template <typename A, int O, bool SEQ, bool STATS>
RLK_CPU_MULTIVERSION __attribute__((flatten)) void policy_block(
    const A* __restrict__ lp_, const A* __restrict__ ol_, const A* __restrict__ m_, const A* __restrict__ adv_,
    const A* __restrict__ w_, const A* __restrict__ kl_, const A* __restrict__ dkl_, const A* __restrict__ ent_,
    const A* __restrict__ ratio_, Scratch<A>* __restrict__ s, int64_t n, const Hyper<A>& h, A seq_pass) {
  const A bound = log_ratio_bound<A>();
  const PGParams<A> p = h.pg;
  const A kc = h.kl_coef, ec = h.entropy_coef;
  for (int64_t i = 0; i < n; ++i) {
    const A lp = lp_[i];
    const A raw = lp - ol_[i];
    const A lr = clamp_value(raw, -bound, bound);
    A passes, r;
    if constexpr (SEQ) {
      passes = seq_pass;
      r = ratio_[i];
    } else {
      passes = one_if<A>((raw >= -bound) & (raw <= bound));
      r = exp_(lr);
    }
    const PGToken<A> t = pg_token<A>(PGObjective(O), lp, r, passes, adv_[i], p);
    const A w = w_[i], m = m_[i];
    const bool on = m != A(0);
    s->wd[i] = on ? m * (w * t.dlogp + kc * dkl_[i]) : A(0);
    if constexpr (STATS) {
      const A kl = kl_[i], ent = ent_[i];
      s->wl[i] = on ? m * (w * t.loss + kc * kl - ec * ent) : A(0);
      s->st[kCount][i] = m;
      s->st[kClipped][i] = on ? m * t.clipped : A(0);
      s->st[kClippedLow][i] = on ? m * t.low : A(0);
      s->st[kClippedHigh][i] = on ? m * t.high : A(0);
      s->st[kClippedDual][i] = on ? m * t.dual : A(0);
      s->st[kNegLogRatio][i] = on ? -m * lr : A(0);
      s->st[kKL][i] = on ? m * kl : A(0);
      s->st[kEntropy][i] = on ? m * ent : A(0);
    }
  }
}

template <typename A>
using BlockFn = void (*)(const A*, const A*, const A*, const A*, const A*, const A*, const A*, const A*, const A*,
                         Scratch<A>*, int64_t, const Hyper<A>&, A);
template <typename A>
using KLFn = void (*)(const A*, const A*, A, A*, A*, int64_t);

// The block loops of one call: the policy loop for its objective, level and pass, and the KL loop for its
// kind (null without KL; the KL arrays then hold zeros).
template <typename A>
struct BlockLoops {
  BlockFn<A> policy = nullptr;
  KLFn<A> kl = nullptr;

  BlockLoops(PGObjective objective, bool seq_level, bool stats, std::optional<KLKind> kind) {
    pick_policy(objective, seq_level, stats);
    if (kind) dispatch_kl_kind(*kind, [&](auto K) { kl = &kl_block<A, K.value>; });
  }

  // Runs the loops over one block; the results land in s->wd (and s->wl, s->st with stats).
  void run(const BlockIn<A>& in, Scratch<A>* s, int64_t n, const Hyper<A>& h, A seq_pass) const {
    if (kl) kl(in.lp, in.ref, h.kl_clamp, s->kl, s->dkl, n);
    policy(in.lp, in.ol, in.m, in.adv, in.w, s->kl, s->dkl, in.ent, in.ratio, s, n, h, seq_pass);
  }

 private:
  template <int O, bool SEQ>
  void pick_pass(bool stats) {
    policy = stats ? &policy_block<A, O, SEQ, true> : &policy_block<A, O, SEQ, false>;
  }
  void pick_policy(PGObjective objective, bool seq_level, bool stats) {
    switch (objective) {  // the sequence level is clip-only
      case PGObjective::Clip:
        return seq_level ? pick_pass<int(PGObjective::Clip), true>(stats)
                         : pick_pass<int(PGObjective::Clip), false>(stats);
      case PGObjective::Cispo:
        return pick_pass<int(PGObjective::Cispo), false>(stats);
      default:
        return pick_pass<int(PGObjective::Sapo), false>(stats);
    }
  }
};

// m · (logp - old_logp) per token of a block, into s->wl (the sequence-level log-ratio's numerator).
template <typename A>
RLK_CPU_MULTIVERSION void log_ratio_block(const A* __restrict__ lp, const A* __restrict__ ol,
                                          const A* __restrict__ m, Scratch<A>* __restrict__ s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) s->wl[i] = m[i] != A(0) ? m[i] * (lp[i] - ol[i]) : A(0);
}

// ---- the tensors of one call, as raw pointers ----

template <typename T>
struct Inputs {
  using A = at::opmath_type<T>;
  int64_t B = 0, T_ = 0;
  const T *logp = nullptr, *old = nullptr, *adv = nullptr, *ref = nullptr, *ent = nullptr, *isw = nullptr;
  const bool* mask_bool = nullptr;
  const A* mask_acc = nullptr;
  bool adv_per_token = false, isw_per_token = false;

  // The tokens [t0, t0 + n) of row b in the accumulation type: pointers into the inputs when they are
  // of that type, else converted into the scratch arrays. Per-row values come from load_row_constants.
  BlockIn<A> load(Scratch<A>* s, int64_t b, int64_t t0, int64_t n) const {
    const int64_t off = b * T_ + t0;
    auto acc = [n](const T* src, A* buf) -> const A* {
      if constexpr (std::is_same_v<T, A>) {
        return src;
      } else {
        convert_span(src, buf, n);
        return buf;
      }
    };
    BlockIn<A> in{acc(logp + off, s->lp), acc(old + off, s->ol), s->m, s->adv, s->w, s->ref, s->ent, s->ratio};
    if (mask_bool) {
      convert_span(reinterpret_cast<const uint8_t*>(mask_bool + off), s->m, n);  // bool bytes are 0 / 1
    } else {
      in.m = mask_acc + off;
    }
    if (adv_per_token) in.adv = acc(adv + off, s->adv);
    if (isw && isw_per_token) in.w = acc(isw + off, s->w);
    if (ref) in.ref = acc(ref + off, s->ref);
    if (ent) in.ent = acc(ent + off, s->ent);
    return in;
  }

  // Fills the scratch arrays that are constant over a task of row b.
  void load_row_constants(Scratch<A>* s, int64_t b) const {
    if (!adv_per_token) fill_span(s->adv, A(adv[b]), kBlock);
    if (!isw) fill_span(s->w, A(1), kBlock);
    if (isw && !isw_per_token) fill_span(s->w, A(isw[b]), kBlock);
    if (!ent) fill_span(s->ent, A(0), kBlock);
    if (!ref) {
      fill_span(s->kl, A(0), kBlock);
      fill_span(s->dkl, A(0), kBlock);
    }
  }
};

// Contiguous copies of the (optional) inputs, kept alive while their pointers are in use.
struct Prepared {
  at::Tensor logp, old, adv, mask, ref, ent, isw;
};

Prepared prepare(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                 const at::Tensor& mask, const std::optional<at::Tensor>& ref_logp,
                 const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& is_weights) {
  const char* op = "rlkernels::policy_loss";
  check_policy_inputs(op, logp, old_logp, mask, ref_logp, entropy);
  check_row_or_token(op, advantages, "advantages", logp);
  if (is_weights) check_row_or_token(op, *is_weights, "is_weights", logp);
  Prepared p;
  p.logp = logp.contiguous();
  p.old = old_logp.contiguous();
  p.adv = advantages.contiguous();
  p.mask = mask.contiguous();
  if (ref_logp) p.ref = ref_logp->contiguous();
  if (entropy) p.ent = entropy->contiguous();
  if (is_weights) p.isw = is_weights->contiguous();
  return p;
}

template <typename T>
Inputs<T> inputs_of(const Prepared& p) {
  using A = at::opmath_type<T>;
  Inputs<T> in;
  in.B = p.logp.size(0);
  in.T_ = p.logp.size(1);
  in.logp = p.logp.const_data_ptr<T>();
  in.old = p.old.const_data_ptr<T>();
  in.adv = p.adv.const_data_ptr<T>();
  in.adv_per_token = p.adv.dim() == 2;
  if (p.mask.scalar_type() == at::kBool) {
    in.mask_bool = p.mask.const_data_ptr<bool>();
  } else {
    in.mask_acc = p.mask.const_data_ptr<A>();
  }
  if (p.ref.defined()) in.ref = p.ref.const_data_ptr<T>();
  if (p.ent.defined()) in.ent = p.ent.const_data_ptr<T>();
  if (p.isw.defined()) {
    in.isw = p.isw.const_data_ptr<T>();
    in.isw_per_token = p.isw.dim() == 2;
  }
  return in;
}

// The row's masked mean log-ratio Σ m·(logp - old) / Σ m (0 for an empty row), rounded to the accumulation
// type (level="sequence"). The kernels clamp it; row_stats keeps it unclamped for the backward pass.
template <typename T>
std::vector<double> sequence_log_ratios(const Inputs<T>& in, const RowTasks& tasks) {
  using A = at::opmath_type<T>;
  std::vector<double> part(tasks.count * 2, 0.0);
  at::parallel_for(0, tasks.count, tasks.grain, [&](int64_t begin, int64_t end) {
    Scratch<A> s;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = tasks.row(task), c0 = tasks.begin(task), c1 = tasks.end(task, in.T_);
      double count = 0, sum = 0;
      for (int64_t t0 = c0; t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0);
        const BlockIn<A> x = in.load(&s, b, t0, n);
        log_ratio_block(x.lp, x.ol, x.m, &s, n);
        count += block_sum(x.m, n);
        sum += block_sum(s.wl, n);
      }
      part[2 * task] = count;
      part[2 * task + 1] = sum;
    }
  });
  std::vector<double> mean(in.B, 0.0);
  for (int64_t b = 0; b < in.B; ++b) {
    double count = 0, sum = 0;
    for (int64_t c = 0; c < tasks.chunks_per_row; ++c) {
      count += part[2 * (b * tasks.chunks_per_row + c)];
      sum += part[2 * (b * tasks.chunks_per_row + c) + 1];
    }
    mean[b] = double(A(count > 0 ? sum / count : 0.0));
  }
  return mean;
}

// The clamped sequence log-ratio and whether the clamp passes its gradient (1) or not (0).
template <typename A>
std::pair<A, A> clamp_sequence_log_ratio(A mean) {
  const A bound = log_ratio_bound<A>();
  return {clamp_value(mean, -bound, bound), A(clamp_passes(mean, -bound, bound))};
}

template <typename T>
Hyper<at::opmath_type<T>> hyper_of(const PolicyLossConfig& c) {
  using A = at::opmath_type<T>;
  return Hyper<A>{c.pg_params<A>(), A(c.kl_coef), value_or_inf<A>(c.kl_clamp), A(c.entropy_coef)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> policy_loss_cpu(
    const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages, const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, c10::string_view objective, bool seq_level, double clip_low,
    double clip_high, std::optional<double> dual_clip, std::optional<double> ratio_cap, double tau_pos,
    double tau_neg, double kl_coef, c10::string_view kl_kind, std::optional<double> kl_clamp,
    double entropy_coef, bool save_grad) {
  const PolicyLossConfig cfg = make_policy_config(objective, seq_level, clip_low, clip_high, dual_clip, ratio_cap,
                                                  tau_pos, tau_neg, kl_coef, kl_kind, kl_clamp, entropy_coef);
  const Prepared p = prepare(logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const auto acc = logp.options().dtype(at::toOpMathType(logp.scalar_type()));
  at::Tensor row_loss = at::empty({B}, acc);
  at::Tensor row_stats = at::empty({B, kRowStats}, acc);
  at::Tensor saved = at::empty({save_grad ? B : 0, save_grad ? T : 0}, acc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logp.scalar_type(), "policy_loss_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(p);
    const RowTasks tasks(B, T);
    const std::vector<double> seq_mean =
        seq_level && T > 0 ? sequence_log_ratios(in, tasks) : std::vector<double>(B, 0.0);
    const Hyper<A> h = hyper_of<scalar_t>(cfg);
    const auto kl_kind = in.ref ? std::optional<KLKind>(cfg.kl_kind) : std::nullopt;
    const BlockLoops<A> loops(cfg.objective, seq_level, /*stats=*/true, kl_kind);
    // Per task: Σ m·L, then the kRowStats stat columns.
    constexpr int kPart = 1 + kRowStats;
    std::vector<double> part(tasks.count * kPart, 0.0);
    A* saved_ptr = save_grad ? saved.mutable_data_ptr<A>() : nullptr;
    at::parallel_for(0, tasks.count, tasks.grain, [&](int64_t begin, int64_t end) {
      Scratch<A> s;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = tasks.row(task), c0 = tasks.begin(task), c1 = tasks.end(task, T);
        in.load_row_constants(&s, b);
        const auto [seq_lr, seq_pass] = clamp_sequence_log_ratio(A(seq_mean[b]));
        if (seq_level) fill_span(s.ratio, exp_(seq_lr), kBlock);
        double* acc_part = &part[task * kPart];
        for (int64_t t0 = c0; t0 < c1; t0 += kBlock) {
          const int64_t n = std::min(kBlock, c1 - t0);
          loops.run(in.load(&s, b, t0, n), &s, n, h, seq_pass);
          acc_part[0] += block_sum(s.wl, n);
          for (int k = 0; k < kRowStats; ++k) {
            if (k != kSeqLogRatio) acc_part[1 + k] += block_sum(s.st[k], n);
          }
          if (saved_ptr) std::copy(s.wd, s.wd + n, saved_ptr + b * T + t0);
        }
      }
    });
    A* loss_ptr = row_loss.mutable_data_ptr<A>();
    A* stats_ptr = row_stats.mutable_data_ptr<A>();
    for (int64_t b = 0; b < B; ++b) {
      double total[kPart] = {};
      for (int64_t c = 0; c < tasks.chunks_per_row; ++c) {
        const double* q = &part[(b * tasks.chunks_per_row + c) * kPart];
        for (int k = 0; k < kPart; ++k) total[k] += q[k];
      }
      loss_ptr[b] = A(total[0]);
      for (int k = 0; k < kRowStats; ++k) stats_ptr[b * kRowStats + k] = A(total[1 + k]);
      stats_ptr[b * kRowStats + kSeqLogRatio] = A(seq_mean[b]);
    }
  });
  return {row_loss, row_stats, saved};
}

std::tuple<at::Tensor, at::Tensor> policy_loss_backward_cpu(
    const at::Tensor& grad_rows, const at::Tensor& row_stats, const at::Tensor& saved_grad,
    const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages, const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, c10::string_view objective, bool seq_level, double clip_low,
    double clip_high, std::optional<double> dual_clip, std::optional<double> ratio_cap, double tau_pos,
    double tau_neg, double kl_coef, c10::string_view kl_kind, std::optional<double> kl_clamp,
    double entropy_coef, bool logp_grad, bool entropy_grad) {
  const char* op = "rlkernels::policy_loss_backward";
  const PolicyLossConfig cfg = make_policy_config(objective, seq_level, clip_low, clip_high, dual_clip, ratio_cap,
                                                  tau_pos, tau_neg, kl_coef, kl_kind, kl_clamp, entropy_coef);
  const Prepared p = prepare(logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const bool use_saved = check_policy_backward_state(op, grad_rows, row_stats, saved_grad, logp);
  const at::Tensor g = grad_rows.contiguous(), rs = row_stats.contiguous(), sv = saved_grad.contiguous();
  at::Tensor grad_logp = at::empty({logp_grad ? B : 0, logp_grad ? T : 0}, logp.options());
  at::Tensor grad_ent = at::empty({entropy_grad ? B : 0, entropy_grad ? T : 0}, logp.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logp.scalar_type(), "policy_loss_backward_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(p);
    const RowTasks tasks(B, T);
    const Hyper<A> h = hyper_of<scalar_t>(cfg);
    const auto kl_kind = in.ref ? std::optional<KLKind>(cfg.kl_kind) : std::nullopt;
    const BlockLoops<A> loops(cfg.objective, seq_level, /*stats=*/false, kl_kind);
    const A* gp = g.const_data_ptr<A>();
    const A* stats = rs.const_data_ptr<A>();
    const A* saved = use_saved ? sv.const_data_ptr<A>() : nullptr;
    scalar_t* out = logp_grad ? grad_logp.mutable_data_ptr<scalar_t>() : nullptr;
    scalar_t* out_ent = entropy_grad ? grad_ent.mutable_data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, tasks.count, tasks.grain, [&](int64_t begin, int64_t end) {
      Scratch<A> s;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = tasks.row(task), c0 = tasks.begin(task), c1 = tasks.end(task, T);
        const A gb = gp[b];
        const auto [seq_lr, seq_pass] = clamp_sequence_log_ratio(stats[b * kRowStats + kSeqLogRatio]);
        // d entropy needs the mask only; d logp the saved gradients or the recomputed tokens.
        const bool recompute = out && !saved;
        if (recompute) in.load_row_constants(&s, b);
        if (recompute && seq_level) fill_span(s.ratio, exp_(seq_lr), kBlock);
        for (int64_t t0 = c0; t0 < c1; t0 += kBlock) {
          const int64_t n = std::min(kBlock, c1 - t0);
          const int64_t off = b * T + t0;
          if (recompute) {
            const BlockIn<A> x = in.load(&s, b, t0, n);
            loops.run(x, &s, n, h, seq_pass);
            scale_span(s.wd, gb, out + off, n);
            if (out_ent) scale_span(x.m, -gb * h.entropy_coef, out_ent + off, n);
            continue;
          }
          if (out) scale_span(saved + off, gb, out + off, n);
          if (out_ent) {
            const A* m = in.mask_acc + off;
            if (in.mask_bool) {
              convert_span(reinterpret_cast<const uint8_t*>(in.mask_bool + off), s.m, n);
              m = s.m;
            }
            scale_span(m, -gb * h.entropy_coef, out_ent + off, n);
          }
        }
      }
    });
  });
  return {grad_logp, grad_ent};
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("policy_loss", &policy_loss_cpu);
  m.impl("policy_loss_backward", &policy_loss_backward_cpu);
}

}  // namespace rlk
