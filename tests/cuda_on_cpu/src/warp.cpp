// Warp-wide operations of the cuda-on-cpu harness over 32-lane warps of the block's fibers.
//
// A lane calling a *_sync operation joins the open collective of its warp with the same mask (or opens
// one), leaves its value, and waits (letting the block's other threads run) until every lane of the mask
// has joined or exited; the lane that
// completes the collective computes every lane's result with the PTX rules (shfl.sync's source lane and
// sub-warp segments; exited lanes named in the mask are ignored, as on a GPU). Reading a lane that is not
// in the mask or has exited is undefined on a GPU; here it is an error of the launch.
#include <bit>

#include "state.h"

namespace rlk_sim {
namespace {

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::ShflIdx:
      return "__shfl_sync";
    case WarpOp::ShflUp:
      return "__shfl_up_sync";
    case WarpOp::ShflDown:
      return "__shfl_down_sync";
    case WarpOp::ShflXor:
      return "__shfl_xor_sync";
    case WarpOp::Ballot:
      return "__ballot_sync";
    case WarpOp::Any:
      return "__any_sync";
    case WarpOp::All:
      return "__all_sync";
    case WarpOp::SyncWarp:
      return "__syncwarp";
  }
  return "?";
}

std::string hex(unsigned mask) {
  char buf[16];
  snprintf(buf, sizeof(buf), "0x%08x", mask);
  return buf;
}

bool is_shuffle(WarpOp op) {
  return op == WarpOp::ShflIdx || op == WarpOp::ShflUp || op == WarpOp::ShflDown || op == WarpOp::ShflXor;
}

// shfl.sync's source lane for `lane` (PTX ISA): segments of `width` lanes; a source outside the valid range
// means the lane keeps its own value.
int source_lane(WarpOp op, int lane, long long b, int width) {
  const int segmask = (int(kWarpSize) - width) & 0x1f;  // c[12:8] of CUDA's __shfl_*_sync
  const int clamp = op == WarpOp::ShflUp ? 0 : 0x1f;     // c[4:0]
  const long long max_lane = (lane & segmask) | (clamp & ~segmask);
  const long long min_lane = lane & segmask;
  long long j = lane;
  bool valid = false;
  switch (op) {
    case WarpOp::ShflUp:
      j = lane - b;
      valid = j >= max_lane;
      break;
    case WarpOp::ShflDown:
      j = lane + b;
      valid = j <= max_lane;
      break;
    case WarpOp::ShflXor:
      j = lane ^ b;
      valid = j <= max_lane;
      break;
    case WarpOp::ShflIdx:
      j = min_lane | (b & ~segmask & 0x1f);
      valid = j <= max_lane;
      break;
    default:
      break;
  }
  return valid ? int(j) : lane;
}

// Every joined lane's result; called by the lane that completes `c`.
void finish(Warp& w, Collective& c) {
  const unsigned joined = c.arrived;
  unsigned votes = 0;
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if ((joined >> l & 1u) && c.in[l] != 0) votes |= 1u << l;
  }
  for (unsigned l = 0; l < kWarpSize; ++l) {
    if (!(joined >> l & 1u)) continue;
    switch (c.op) {
      case WarpOp::Ballot:
        c.out[l] = votes;
        break;
      case WarpOp::Any:
        c.out[l] = votes != 0;
        break;
      case WarpOp::All:
        c.out[l] = votes == joined;
        break;
      case WarpOp::SyncWarp:
        c.out[l] = 0;
        break;
      default: {
        const int src = source_lane(c.op, int(l), c.param[l], c.width);
        if (joined >> src & 1u) {
          c.out[l] = c.in[src];
          break;
        }
        c.out[l] = c.in[l];
        const bool in_mask = c.mask >> src & 1u;  // then it has exited (or does not exist)
        device_error(c.site,
                     std::string(op_name(c.op)) + " with mask " + hex(c.mask) + ": lane " + std::to_string(l) +
                         " reads lane " + std::to_string(src) +
                         (in_mask ? ", which has exited (or does not exist)" : ", which is not in the mask"),
                     int(t_ctx.tid - t_ctx.lane + l));
      }
    }
  }
  c.complete = true;
}

// Completes `c` once every lane of its mask has joined or exited.
void maybe_finish(Warp& w, Collective& c) {
  if (!c.complete && ((c.arrived | (w.exited & c.mask)) & c.mask) == c.mask) {
    finish(w, c);
  }
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, long long param, int width, int size,
                         const Site& site) {
  ThreadContext& ctx = t_ctx;
  Warp& w = *ctx.warp;
  const unsigned bit = 1u << ctx.lane;
  if (!(mask & bit)) {
    device_error(site, std::string(op_name(op)) + " with mask " + hex(mask) + " called by lane " +
                           std::to_string(ctx.lane) + ", which is not in the mask");
    return value;
  }
  if (is_shuffle(op) && (width < 1 || width > int(kWarpSize) || !std::has_single_bit(unsigned(width)))) {
    device_error(site, std::string(op_name(op)) + " with width " + std::to_string(width) +
                           " (must be a power of two in [1, 32])");
    return value;
  }
  Collective* c = nullptr;
  for (Collective& o : w.open) {
    if (!o.complete && o.mask == mask && !(o.arrived & bit)) {
      c = &o;
      break;
    }
  }
  if (c == nullptr) {
    c = &w.open.emplace_back();
    c->op = op;
    c->width = width;
    c->size = size;
    c->mask = mask;
    c->site = site;
  } else if (c->op != op || c->width != width || c->size != size) {
    device_error(site, std::string("lanes of mask ") + hex(mask) + " meet in different warp operations: " +
                           op_name(op) + " (width " + std::to_string(width) + ", " + std::to_string(size) +
                           "-byte values) and " + op_name(c->op) + " (width " + std::to_string(c->width) + ", " +
                           std::to_string(c->size) + "-byte values) at " + where(c->site));
  }
  c->in[ctx.lane] = value;
  c->param[ctx.lane] = param;
  c->arrived |= bit;
  maybe_finish(w, *c);
  wait_until(site, [c] { return c->complete; });
  const uint64_t result = c->out[ctx.lane];
  if (++c->readers == unsigned(std::popcount(c->arrived))) {
    for (auto it = w.open.begin(); it != w.open.end(); ++it) {
      if (&*it == c) {
        w.open.erase(it);
        break;
      }
    }
  }
  return result;
}

void warp_exit() {
  ThreadContext& ctx = t_ctx;
  Warp& w = *ctx.warp;
  w.exited |= 1u << ctx.lane;
  for (Collective& c : w.open) maybe_finish(w, c);
}

}  // namespace rlk_sim
