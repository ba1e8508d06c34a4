// Errors of the cuda-on-cpu harness: what a device thread records (the launch then fails with
// cudaErrorLaunchFailure and the message) and the host thread's last-error state of the CUDA API.
#include <stdio.h>
#include <string.h>

#include "state.h"

namespace rlk_sim {
namespace {

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local cudaError_t t_message_code = cudaSuccess;  // the code t_message describes
thread_local std::string t_message;

const char* basename_of(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

std::string where(const Site& site) {
  return std::string(basename_of(site.file_name())) + ":" + std::to_string(site.line());
}

void device_error(const Site& site, const std::string& what, int tid) {
  const ThreadContext& c = t_ctx;
  Launch* l = c.block ? c.block->launch : nullptr;
  if (l == nullptr) {  // outside a launch (a harness bug): say so rather than lose it
    fprintf(stderr, "cuda-on-cpu: %s at %s outside a kernel launch\n", what.c_str(), where(site).c_str());
    return;
  }
  const unsigned t = tid < 0 ? c.tid : unsigned(tid);
  const dim3 b = l->block;
  char coords[160];
  snprintf(coords, sizeof(coords), "block (%u,%u,%u) thread (%u,%u,%u) [warp %u lane %u]", blockIdx.x,
           blockIdx.y, blockIdx.z, t % b.x, t / b.x % b.y, t / (b.x * b.y), t / kWarpSize, t % kWarpSize);
  const std::lock_guard<std::mutex> lock(l->mutex);
  if (l->error.empty()) {
    l->error = std::string("cuda-on-cpu: ") + l->kernel + " launched at " + l->where + ": " + coords + " at " +
               where(site) + ": " + what;
  }
}

void set_last_error(cudaError_t code, const std::string& message) {
  t_last_error = code;
  t_message_code = code;
  t_message = message;
}

namespace {
std::mutex g_asserts_mutex;
std::vector<std::string> g_asserts;  // "kernel: message", in the order they failed
}  // namespace

void device_assert(const char* message, const char* file, unsigned line, const char* function) {
  const ThreadContext& c = t_ctx;
  const char* kernel = c.block ? c.block->launch->kernel : "(outside a launch)";
  const std::lock_guard<std::mutex> lock(g_asserts_mutex);
  g_asserts.push_back(std::string(kernel) + ": " + message + " (" + basename_of(file) + ":" + std::to_string(line) +
                      " " + function + ")");
}

std::vector<std::string> take_device_asserts() {
  const std::lock_guard<std::mutex> lock(g_asserts_mutex);
  return std::exchange(g_asserts, {});
}

void trap(const Site& site) {
  device_error(site, "__trap()");
  fprintf(stderr, "cuda-on-cpu: __trap() at %s\n", where(site).c_str());
  abort();
}

}  // namespace rlk_sim

cudaError_t cudaGetLastError() {
  const cudaError_t e = rlk_sim::t_last_error;
  rlk_sim::t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return rlk_sim::t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorAssert:
      return "cudaErrorAssert";
    case cudaErrorIllegalInstruction:
      return "cudaErrorIllegalInstruction";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  if (error != cudaSuccess && error == rlk_sim::t_message_code && !rlk_sim::t_message.empty()) {
    return rlk_sim::t_message.c_str();
  }
  return cudaGetErrorName(error);
}
