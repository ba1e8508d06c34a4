// policy_loss on CPU: one forward pass over the tokens producing the per-row masked sums (and, when asked,
// the per-token gradient d S_b / d logp), one backward pass writing d logp and d entropy.
//
// Work is split into (row, chunk) tasks of at most kChunk tokens; each task walks its chunk in blocks of
// kBlock tokens: the inputs of a block are converted to the accumulation type in L1-resident scratch
// arrays where needed, then one branch-free loop (compiled per objective x level x KL kind, vectorized with
// the exp of vmath.h) computes every per-token term, writes the gradient and adds the sums to 16 lanes held
// across the block, which are flushed into fp64 lanes after it. The same loop checks the input values it reads
// (aggregation.h: NaN log-probs where the mask keeps the token, non-finite advantages, bad weights and mask
// values) into a count that becomes the op's `ok` flag, at no extra pass.
// Chunk partials are combined per row in a fixed order, and the loss finished from the rows' fp64 sums
// (aggregation_host.h finish_rows): results do not depend on the thread count.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "rlkernels/policy_loss_host.h"
#include "loss_masks.h"
#include "row_loops.h"

namespace rlk {
namespace {

// Conversion buffers of one block (used for fp16/bf16 inputs, bool masks and per-row constants) and its
// per-token gradients when the forward pass does not save them.
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
  alignas(64) A wd[kBlock];     // m · dL/dlogp
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
  KLKind kl_kind;
};

// Sums of a forward task, in the RowStat column order with Σ m·L in the kSeqLogRatio slot (the sequence
// log-ratio is not a token sum), then the count of rejected input values (kBadSum): kLanes lanes in the
// accumulation type per block (token i adds to lane i % kLanes), flushed into fp64 lanes after every block,
// totalled in a fixed order at the end. No reassociation anywhere, so the loops vectorize and the result does
// not depend on the instruction set.
constexpr int kLossSum = kSeqLogRatio;
constexpr int kBadSum = kRowStats;
constexpr int kSums = kRowStats + 1;

template <typename A>
struct LaneSums {
  alignas(64) A block[kSums][kLanes];
  alignas(64) double task[kSums][kLanes];

  LaneSums() {
    for (int k = 0; k < kSums; ++k) {
      for (int l = 0; l < kLanes; ++l) block[k][l] = A(0), task[k][l] = 0.0;
    }
  }
  double total(int k) const {
    double t = 0;
    for (int l = 0; l < kLanes; ++l) t += task[k][l];
    return t;
  }
};

template <typename A>
RLK_CPU_MULTIVERSION void flush_lanes(LaneSums<A>* __restrict__ s) {
  for (int k = 0; k < kSums; ++k) {
    for (int l = 0; l < kLanes; ++l) {
      s->task[k][l] += double(s->block[k][l]);
      s->block[k][l] = A(0);
    }
  }
}

// ---- the block loop (a plain function over raw pointers so that gcc vectorizes it) ----

// No KL term (ref_logp absent): the KL columns are zeros.
constexpr int kNoKL = -1;
// The KL kind read at run time (Hyper::kl_kind): the fp64 loops, which exist for gradchecks, not speed, so
// that they are not compiled once per kind.
constexpr int kRuntimeKL = -2;

// Every per-token term of token i: writes m·dL/dlogp to wd[i] and adds m·L and the stat columns to lane l
// of the block sums. SEQ: level="sequence" (r is the row's ratio, read from `ratio_` so that gcc vectorizes
// the selects on it; `seq_pass` says whether its clamp passes the gradient). K: the KL kind, kNoKL or
// kRuntimeKL. UNIT: the mask came from a bool or integer tensor, so its weights are 0 / 1 and every m·x is a
// select. Masked tokens (m == 0) contribute exact zeros whatever their inputs hold (selects, not products, so
// a NaN or inf at padding never leaks). The token's rejected input values (aggregation.h) add 1 to the bad
// lane.
template <typename A, int O, bool SEQ, int K, bool UNIT>
__attribute__((always_inline)) inline void policy_token(
    const A* __restrict__ lp_, const A* __restrict__ ol_, const A* __restrict__ m_, const A* __restrict__ adv_,
    const A* __restrict__ w_, const A* __restrict__ ref_, const A* __restrict__ ent_, const A* __restrict__ ratio_,
    A* __restrict__ wd, LaneSums<A>* __restrict__ sums, int64_t i, int l, const PGParams<A>& p, A kc, A clamp,
    A ec, KLKind kind, A seq_pass) {
  const A bound = log_ratio_bound<A>();
  const A lp = lp_[i], ol = ol_[i];
  const A raw = lp - ol;
  const A lr = clamp_value(raw, -bound, bound);
  A passes, r;
  if constexpr (SEQ) {
    passes = seq_pass;
    r = ratio_[i];
  } else {
    passes = one_if<A>((raw >= -bound) & (raw <= bound));
    r = exp_(lr);
  }
  const PGToken<A> t = pg_token<A>(PGObjective(O), lp, ol, r, passes, adv_[i], p);
  A kl = A(0), dkl = A(0);
  if constexpr (K != kNoKL) {
    const KLKind k = K == kRuntimeKL ? kind : KLKind(K);
    kl = kl_value<A>(k, lp, ref_[i], clamp);
    dkl = kl_grad<A>(k, lp, ref_[i], clamp);
  }
  // vespo folds its IS weights into the row's weight (the sequence pass) instead of multiplying the term.
  const A w = O == int(PGObjective::Vespo) ? A(1) : w_[i];
  const A m = m_[i], ent = ent_[i];
  const bool on = m != A(0);
  // vespo reads its IS weights in the sequence pass; they are checked here all the same.
  bool bad = (on & ((lp != lp) | (ol != ol))) | !finite_value(adv_[i]) | bad_weight(w_[i]);
  if constexpr (K != kNoKL) bad = bad | (on & (ref_[i] != ref_[i]));
  if constexpr (!UNIT) bad = bad | bad_weight(m);
  auto masked = [&](A x) {  // m · x, and exact zeros at masked tokens
    if constexpr (UNIT) {
      return on ? x : A(0);
    } else {
      return on ? m * x : A(0);
    }
  };
  wd[i] = masked(w * t.dlogp + kc * dkl);
  A(*b)[kLanes] = sums->block;
  b[kLossSum][l] += masked(w * t.loss + kc * kl - ec * ent);
  b[kCount][l] += m;
  b[kClipfrac][l] += masked(t.clipped);
  b[kClipfracLow][l] += masked(t.low);
  b[kClipfracHigh][l] += masked(t.high);
  b[kClipfracDual][l] += masked(t.dual);
  b[kApproxKl][l] += masked(-lr);
  b[kKl][l] += masked(kl);
  b[kEntropy][l] += masked(ent);
  b[kBadSum][l] += one_if<A>(bad);
}

// The tokens [0, n) of a block, kLanes at a time (one vector of lanes), then the tail. `flatten` inlines
// exp_ and the math of the headers, which the vectorizer needs.
template <typename A, int O, bool SEQ, int K, bool UNIT>
RLK_CPU_MULTIVERSION __attribute__((flatten)) void policy_block(
    const A* __restrict__ lp_, const A* __restrict__ ol_, const A* __restrict__ m_, const A* __restrict__ adv_,
    const A* __restrict__ w_, const A* __restrict__ ref_, const A* __restrict__ ent_, const A* __restrict__ ratio_,
    A* __restrict__ wd, LaneSums<A>* __restrict__ sums, int64_t n, const Hyper<A>& h, A seq_pass) {
  const PGParams<A> p = h.pg;
  const A kc = h.kl_coef, clamp = h.kl_clamp, ec = h.entropy_coef;
  const KLKind kind = h.kl_kind;
  int64_t i0 = 0;
  for (; i0 + kLanes <= n; i0 += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      policy_token<A, O, SEQ, K, UNIT>(lp_, ol_, m_, adv_, w_, ref_, ent_, ratio_, wd, sums, i0 + l, l, p, kc,
                                       clamp, ec, kind, seq_pass);
    }
  }
  for (int l = 0; i0 + l < n; ++l) {
    policy_token<A, O, SEQ, K, UNIT>(lp_, ol_, m_, adv_, w_, ref_, ent_, ratio_, wd, sums, i0 + l, l, p, kc, clamp,
                                     ec, kind, seq_pass);
  }
}

template <typename A>
using BlockFn = void (*)(const A*, const A*, const A*, const A*, const A*, const A*, const A*, const A*, A*,
                         LaneSums<A>*, int64_t, const Hyper<A>&, A);

// The block loop of one call, compiled per objective x level x KL kind (fp32; fp64: KL kind at run time) x
// 0 / 1 (bool or integer) or float mask.
template <typename A>
struct BlockLoop {
  BlockFn<A> fn = nullptr;

  BlockLoop(PGObjective objective, bool seq_level, std::optional<KLKind> kind, bool unit_mask) {
    if (!kind) {
      pick_mask<kNoKL>(objective, seq_level, unit_mask);
    } else if constexpr (std::is_same_v<A, double>) {
      pick_mask<kRuntimeKL>(objective, seq_level, unit_mask);
    } else {
      dispatch_kl_kind(*kind, [&](auto K) { pick_mask<int(K.value)>(objective, seq_level, unit_mask); });
    }
  }

  // Runs the loop over one block: m·dL/dlogp into wd[0, n), the sums into `sums`'s block lanes.
  void run(const BlockIn<A>& x, A* wd, LaneSums<A>* sums, int64_t n, const Hyper<A>& h, A seq_pass) const {
    fn(x.lp, x.ol, x.m, x.adv, x.w, x.ref, x.ent, x.ratio, wd, sums, n, h, seq_pass);
  }

 private:
  template <int K>
  void pick_mask(PGObjective objective, bool seq_level, bool unit_mask) {
    dispatch_pg_objective(objective, [&](auto O) {
      constexpr int kO = int(decltype(O)::value);
      fn = unit_mask ? pick_level<kO, K, true>(seq_level) : pick_level<kO, K, false>(seq_level);
    });
  }
  template <int O, int K, bool UNIT>
  static BlockFn<A> pick_level(bool seq_level) {
    if constexpr (O == int(PGObjective::Clip)) {  // the sequence level (GSPO) of the token objectives is clip's
      if (seq_level) return &policy_block<A, O, true, K, UNIT>;
    }
    if constexpr (O == int(PGObjective::GeoMean) || O == int(PGObjective::Vespo)) {  // always per row
      return &policy_block<A, O, true, K, UNIT>;
    }
    return &policy_block<A, O, false, K, UNIT>;
  }
};

// m · (the token's term of its row's log-ratio statistic) per token of a block, into s->wd
// (sequence_token_log_ratio: GSPO's lr, geo_mean's clipped lr, vespo's clamped lr + folded IS weight).
template <typename A>
RLK_CPU_MULTIVERSION void log_ratio_block(const BlockIn<A>& x, PGObjective objective, const PGParams<A>& p,
                                          Scratch<A>* __restrict__ s, int64_t n) {
  const bool vespo = objective == PGObjective::Vespo;
  for (int64_t i = 0; i < n; ++i) {
    const A log_isw = vespo ? vlog_(x.w[i]) : A(0);
    const A term = sequence_token_log_ratio(objective, x.lp[i], x.ol[i], x.adv[i], log_isw, p);
    s->wd[i] = x.m[i] != A(0) ? x.m[i] * term : A(0);
  }
}

// ---- the tensors of one call, as raw pointers ----

template <typename T>
struct Inputs {
  using A = at::opmath_type<T>;
  int64_t B = 0, T_ = 0;
  const T *logp = nullptr, *old = nullptr, *adv = nullptr, *ref = nullptr, *ent = nullptr, *isw = nullptr;
  MaskIn<A> mask;
  bool adv_per_token = false, isw_per_token = false;

  // The tokens [t0, t0 + n) of row b in the accumulation type: pointers into the inputs when they are
  // of that type, else converted into the scratch arrays. Per-row values come from load_row_constants.
  // Adds to *bad the integer mask values other than 0 and 1.
  BlockIn<A> load(Scratch<A>* s, int64_t b, int64_t t0, int64_t n, int64_t* bad) const {
    const int64_t off = b * T_ + t0;
    auto acc = [n](const T* src, A* buf) -> const A* {
      if constexpr (std::is_same_v<T, A>) {
        return src;
      } else {
        convert_span(src, buf, n);
        return buf;
      }
    };
    // A bool or integer mask is converted first: read in place, its 1-byte type makes gcc vectorize the token
    // loop with 16-byte vectors, 3x slower.
    BlockIn<A> in{acc(logp + off, s->lp), acc(old + off, s->ol), mask.span(off, n, s->m, bad),
                  s->adv, s->w, s->ref, s->ent, s->ratio};
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
  }
};

// Contiguous copies of the (optional) inputs, kept alive while their pointers are in use.
struct Prepared {
  at::Tensor logp, old, adv, mask, ref, ent, isw;
  MaskType mask_type;
};

Prepared prepare(const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages,
                 const at::Tensor& mask, const std::optional<at::Tensor>& ref_logp,
                 const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& is_weights) {
  const char* op = "rlkernels::policy_loss";
  const MaskType mask_type = check_policy_inputs(op, logp, old_logp, mask, ref_logp, entropy);
  check_row_or_token(op, advantages, "advantages", logp);
  if (is_weights) check_row_or_token(op, *is_weights, "is_weights", logp);
  Prepared p;
  p.mask_type = mask_type;
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
  in.mask = MaskIn<A>{p.mask_type, p.mask.const_data_ptr()};
  if (p.ref.defined()) in.ref = p.ref.const_data_ptr<T>();
  if (p.ent.defined()) in.ent = p.ent.const_data_ptr<T>();
  if (p.isw.defined()) {
    in.isw = p.isw.const_data_ptr<T>();
    in.isw_per_token = p.isw.dim() == 2;
  }
  return in;
}

// The row's log-ratio statistic (seq_level): the masked mean of the tokens' terms (0 for an empty row), or
// their sum for vespo, rounded to the accumulation type. The kernels clamp it; row_stats keeps it unclamped
// for the backward pass.
template <typename T>
std::vector<double> sequence_log_ratios(const Inputs<T>& in, const RowTasks& tasks, PGObjective objective,
                                        const PGParams<at::opmath_type<T>>& p) {
  using A = at::opmath_type<T>;
  std::vector<double> part(tasks.count * 2, 0.0);
  at::parallel_for(0, tasks.count, tasks.grain, [&](int64_t begin, int64_t end) {
    Scratch<A> s;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = tasks.row(task), c0 = tasks.begin(task), c1 = tasks.end(task, in.T_);
      in.load_row_constants(&s, b);
      double count = 0, sum = 0;
      int64_t unchecked = 0;  // the main pass checks the mask
      for (int64_t t0 = c0; t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0);
        const BlockIn<A> x = in.load(&s, b, t0, n, &unchecked);
        log_ratio_block(x, objective, p, &s, n);
        count += block_sum(x.m, n);
        sum += block_sum(s.wd, n);
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
    mean[b] = double(A(!sequence_statistic_is_mean(objective) ? sum : count > 0 ? sum / count : 0.0));
  }
  return mean;
}

// The clamped sequence log-ratio and whether the clamp passes its gradient (1) or not (0).
template <typename A>
std::pair<A, A> clamp_sequence_log_ratio(PGObjective objective, A stat) {
  A lr, pass;
  sequence_log_ratio(objective, stat, lr, pass);
  return {lr, pass};
}

template <typename T>
Hyper<at::opmath_type<T>> hyper_of(const PolicyLossConfig& c) {
  using A = at::opmath_type<T>;
  return Hyper<A>{pg_params<A>(c), A(c.kl_coef), value_or_inf<A>(c.kl_clamp), A(c.entropy_coef), c.kl_kind};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_cpu(
    const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages, const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, RLK_POLICY_CONFIG_PARAMS, RLK_AGG_CONFIG_PARAMS, bool save_grad) {
  const AggParams agg_params = make_agg_args("rlkernels::policy_loss", logp.device(), RLK_AGG_CONFIG_ARGS);
  const PolicyLossConfig cfg = make_policy_config(RLK_POLICY_CONFIG_ARGS);
  const Prepared p = prepare(logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const auto acc = logp.options().dtype(acc_scalar_type(logp.scalar_type()));
  at::Tensor loss = at::empty({}, acc);
  at::Tensor stats = at::empty({kRowStats - kFirstStat}, acc);
  at::Tensor row_weights = at::empty({B}, acc);
  at::Tensor row_stats = at::empty({B, kRowStats}, acc);
  at::Tensor saved = at::empty({save_grad ? B : 0, save_grad ? T : 0}, acc);
  at::Tensor ok = at::empty({}, logp.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logp.scalar_type(), "policy_loss_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(p);
    const RowTasks tasks(B, T);
    const std::vector<double> seq_mean =
        cfg.seq_level && T > 0 ? sequence_log_ratios(in, tasks, cfg.objective, pg_params<A>(cfg))
                               : std::vector<double>(B, 0.0);
    const Hyper<A> h = hyper_of<scalar_t>(cfg);
    const auto kl_kind = in.ref ? std::optional<KLKind>(cfg.kl_kind) : std::nullopt;
    const BlockLoop<A> loop(cfg.objective, cfg.seq_level, kl_kind, in.mask.unit());
    // Per task: the kSums sums (LaneSums' column order).
    std::vector<double> part(tasks.count * kSums, 0.0);
    A* saved_ptr = save_grad ? saved.mutable_data_ptr<A>() : nullptr;
    at::parallel_for(0, tasks.count, tasks.grain, [&](int64_t begin, int64_t end) {
      Scratch<A> s;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = tasks.row(task), c0 = tasks.begin(task), c1 = tasks.end(task, T);
        in.load_row_constants(&s, b);
        const auto [seq_lr, seq_pass] = clamp_sequence_log_ratio(cfg.objective, A(seq_mean[b]));
        if (cfg.seq_level) fill_span(s.ratio, exp_(seq_lr), kBlock);
        LaneSums<A> sums;
        int64_t bad_mask = 0;
        for (int64_t t0 = c0; t0 < c1; t0 += kBlock) {
          const int64_t n = std::min(kBlock, c1 - t0);
          A* wd = saved_ptr ? saved_ptr + b * T + t0 : s.wd;
          loop.run(in.load(&s, b, t0, n, &bad_mask), wd, &sums, n, h, seq_pass);
          flush_lanes(&sums);
        }
        for (int k = 0; k < kSums; ++k) part[task * kSums + k] = sums.total(k);
        part[task * kSums + kBadSum] += double(bad_mask);
      }
    });
    // The rows' sums in fp64 (chunks in order), their kSeqLogRatio column the row's statistic; then the loss.
    std::vector<double> rows(B * kSums, 0.0);
    A* stats_ptr = row_stats.mutable_data_ptr<A>();
    for (int64_t b = 0; b < B; ++b) {
      double* total = &rows[b * kSums];
      for (int64_t c = 0; c < tasks.chunks_per_row; ++c) {
        const double* q = &part[(b * tasks.chunks_per_row + c) * kSums];
        for (int k = 0; k < kSums; ++k) total[k] += q[k];
      }
      for (int k = 0; k < kRowStats; ++k) stats_ptr[b * kRowStats + k] = A(total[k]);
      stats_ptr[b * kRowStats + kSeqLogRatio] = A(seq_mean[b]);
    }
    *ok.mutable_data_ptr<bool>() = finish_rows<A>(
        rows.data(), B, kSums, kLossSum, kCount, kFirstStat, kRowStats - kFirstStat, kBadSum, agg_params,
        loss.mutable_data_ptr<A>(), stats.mutable_data_ptr<A>(), row_weights.mutable_data_ptr<A>());
  });
  return {loss, stats, row_weights, row_stats, saved, ok};
}

std::tuple<at::Tensor, at::Tensor> policy_loss_backward_cpu(
    const at::Tensor& grad_loss, const at::Tensor& row_weights, const at::Tensor& row_stats,
    const at::Tensor& saved_grad,
    const at::Tensor& logp, const at::Tensor& old_logp, const at::Tensor& advantages, const at::Tensor& mask,
    const std::optional<at::Tensor>& ref_logp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& is_weights, RLK_POLICY_CONFIG_PARAMS, bool logp_grad, bool entropy_grad) {
  const char* op = "rlkernels::policy_loss_backward";
  const PolicyLossConfig cfg = make_policy_config(RLK_POLICY_CONFIG_ARGS);
  const Prepared p = prepare(logp, old_logp, advantages, mask, ref_logp, entropy, is_weights);
  const int64_t B = logp.size(0), T = logp.size(1);
  const bool use_saved = check_policy_backward_state(op, grad_loss, row_weights, row_stats, saved_grad, logp);
  const at::Tensor w = row_weights.contiguous(), rs = row_stats.contiguous(), sv = saved_grad.contiguous();
  at::Tensor grad_logp = at::empty({logp_grad ? B : 0, logp_grad ? T : 0}, logp.options());
  at::Tensor grad_ent = at::empty({entropy_grad ? B : 0, entropy_grad ? T : 0}, logp.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logp.scalar_type(), "policy_loss_backward_cpu", [&] {
    using A = at::opmath_type<scalar_t>;
    const Inputs<scalar_t> in = inputs_of<scalar_t>(p);
    const RowTasks tasks(B, T);
    const Hyper<A> h = hyper_of<scalar_t>(cfg);
    const auto kl_kind = in.ref ? std::optional<KLKind>(cfg.kl_kind) : std::nullopt;
    const BlockLoop<A> loop(cfg.objective, cfg.seq_level, kl_kind, in.mask.unit());
    const A g = grad_loss.item<A>();
    const A* wp = w.const_data_ptr<A>();
    const A* stats = rs.const_data_ptr<A>();
    const A* saved = use_saved ? sv.const_data_ptr<A>() : nullptr;
    scalar_t* out = logp_grad ? grad_logp.mutable_data_ptr<scalar_t>() : nullptr;
    scalar_t* out_ent = entropy_grad ? grad_ent.mutable_data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, tasks.count, tasks.grain, [&](int64_t begin, int64_t end) {
      Scratch<A> s;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = tasks.row(task), c0 = tasks.begin(task), c1 = tasks.end(task, T);
        const A gb = g * wp[b];  // d output / d row sum
        const auto [seq_lr, seq_pass] = clamp_sequence_log_ratio(cfg.objective, stats[b * kRowStats + kSeqLogRatio]);
        // d entropy needs the mask only; d logp the saved gradients or the recomputed tokens.
        const bool recompute = out && !saved;
        if (recompute) in.load_row_constants(&s, b);
        if (recompute && cfg.seq_level) fill_span(s.ratio, exp_(seq_lr), kBlock);
        LaneSums<A> unused;  // the forward pass's sums, recomputed along with the gradients (ignored)
        int64_t checked = 0;  // by the forward pass
        for (int64_t t0 = c0; t0 < c1; t0 += kBlock) {
          const int64_t n = std::min(kBlock, c1 - t0);
          const int64_t off = b * T + t0;
          if (recompute) {
            const BlockIn<A> x = in.load(&s, b, t0, n, &checked);
            loop.run(x, s.wd, &unused, n, h, seq_pass);
            scale_span(s.wd, gb, out + off, n);
            if (out_ent) scale_span(x.m, -gb * h.entropy_coef, out_ent + off, n);
            continue;
          }
          if (out) scale_span(saved + off, gb, out + off, n);
          if (out_ent) scale_span(in.mask.span(off, n, s.m, &checked), -gb * h.entropy_coef, out_ent + off, n);
        }
      }
    });
  });
  return {grad_logp, grad_ent};
}

// The eager backward's last read of the forward's saved d S_b / d logp: scales it in place into d output /
// d logp and writes d output / d entropy in the same pass over the rows (ops/policy_loss.py).
at::Tensor policy_loss_backward_into_saved_cpu(at::Tensor& saved_grad, const at::Tensor& grad_loss,
                                               const at::Tensor& row_weights, const at::Tensor& mask,
                                               double entropy_coef, bool entropy_grad) {
  const char* op = "rlkernels::policy_loss_backward_into_saved";
  const auto dtype = saved_grad.scalar_type();
  TORCH_CHECK(saved_grad.dim() == 2 && saved_grad.is_contiguous() && (dtype == at::kFloat || dtype == at::kDouble),
              op, ": saved_grad must be a contiguous [B, T] float32 or float64 tensor, got ", saved_grad.sizes(),
              " of ", dtype);
  const int64_t B = saved_grad.size(0), T = saved_grad.size(1);
  check_loss_grad(op, grad_loss, row_weights, B, dtype, saved_grad.device());
  const MaskType mask_type = check_token_mask(op, mask, saved_grad);
  const at::Tensor w = row_weights.contiguous(), m = mask.contiguous();
  at::Tensor grad_ent = at::empty({entropy_grad ? B : 0, entropy_grad ? T : 0}, saved_grad.options());
  AT_DISPATCH_FLOATING_TYPES(dtype, "policy_loss_backward_into_saved_cpu", [&] {
    using A = scalar_t;
    const A g = grad_loss.item<A>();
    const A* wp = w.const_data_ptr<A>();
    A* saved = saved_grad.mutable_data_ptr<A>();
    A* out_ent = entropy_grad ? grad_ent.mutable_data_ptr<A>() : nullptr;
    const MaskIn<A> mask_in{mask_type, m.const_data_ptr()};
    const RowTasks tasks(B, T);
    tasks.for_each([&](int64_t task) {
      alignas(64) A mask_buf[kBlock];
      int64_t checked = 0;  // by the forward pass
      const int64_t b = tasks.row(task), c1 = tasks.end(task, T);
      const A gb = g * wp[b];  // d output / d row sum
      for (int64_t t0 = tasks.begin(task); t0 < c1; t0 += kBlock) {
        const int64_t n = std::min(kBlock, c1 - t0), off = b * T + t0;
        scale_in_place(saved + off, gb, n);
        if (out_ent) scale_span(mask_in.span(off, n, mask_buf, &checked), -gb * A(entropy_coef), out_ent + off, n);
      }
    });
  });
  return grad_ent;
}

}  // namespace

TORCH_LIBRARY_IMPL(rlkernels, CPU, m) {
  m.impl("policy_loss", &policy_loss_cpu);
  m.impl("policy_loss_backward", &policy_loss_backward_cpu);
  m.impl("policy_loss_backward_into_saved", &policy_loss_backward_into_saved_cpu);
}

}  // namespace rlk
