// rlkernels_sim_stats::launches(): the harness's kernel launches so far, for counting what a CUDA binding
// launches per call (benchmarks/gpu_cost.py native_kernels; tests/test_gpu_budgets.py).
#include <torch/library.h>

#include <cstdint>

namespace rlk_sim {
int64_t launch_count();  // grid.cpp (declared for kernels in rlk_sim/device.h)
}

TORCH_LIBRARY(rlkernels_sim_stats, m) {
  m.def("launches() -> int", []() -> int64_t { return rlk_sim::launch_count(); });
}
