// The host side of the CUDA runtime API as the rlkernels sources use it, for the cuda-on-cpu harness:
// error codes, streams, dim3 / uint3 and the last-error state. Torch-free and thread-free: the launcher
// headers (csrc/cuda/*.h) and the bindings reach it through the shim cuda_runtime_api.h.
//
// Every launch runs to completion before it returns (one host thread, one device, one stream), so streams
// are opaque handles that are never dereferenced and synchronization is a no-op.
#pragma once

#include <stddef.h>
#include <stdint.h>

// The codes the sources return or compare with, numbered as in CUDA 13's driver_types.h.
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorAssert = 710,
  cudaErrorIllegalInstruction = 715,
  cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;

typedef struct CUstream_st* cudaStream_t;

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// The last error of this host thread (cleared by reading it), as in CUDA; a launch that failed in the
// harness (a bad configuration, a warp op reading an exited lane, ...) leaves its error here.
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
// For an error the harness recorded: its message (what, where), until the next error; else the code's name.
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
inline cudaError_t cudaDeviceSynchronize() { return cudaPeekAtLastError(); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaPeekAtLastError(); }
