// rlkernels_sim_stats::launches(): the harness's kernel launches so far, for counting what a CUDA binding
// launches per call (benchmarks/gpu_cost.py native_kernels; tests/test_gpu_budgets.py).
// rlkernels_sim_stats::launched(): the kernels launched since its last call, as their launch sites spell them
// ("value_forward_kernel<T, M, kVec<T>>"): which variant a launcher chose (tests/test_token_packs.py).
// rlkernels_sim_stats::device_asserts(): the device-side asserts that failed since the last call, each
// "kernel: message (file:line function)" (tests/test_device_asserts.py).
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rlk_sim {
int64_t launch_count();  // grid.cpp (declared for kernels in rlk_sim/device.h)
std::vector<std::string> take_launched();  // grid.cpp
std::vector<std::string> take_device_asserts();  // errors.cpp
}

TORCH_LIBRARY(rlkernels_sim_stats, m) {
  m.def("launches() -> int", []() -> int64_t { return rlk_sim::launch_count(); });
  m.def("launched() -> str[]", []() -> std::vector<std::string> { return rlk_sim::take_launched(); });
  m.def("device_asserts() -> str[]", []() -> std::vector<std::string> { return rlk_sim::take_device_asserts(); });
}
