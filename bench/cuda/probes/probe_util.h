// Shared by the standalone GPU probes (bench/cuda/probes): a CUDA call check that exits with the
// call and its error, and event timing of a launch sequence.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

namespace probe {

// Milliseconds per launch: launch(i) for i = 0..2 as warm-up, then `reps` launches between two
// events (launch(i) gets the repetition index, e.g. to rotate buffers).
template <class F>
float time_ms(F&& launch, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch(i);
  CK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) launch(i);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ms / reps;
}

}  // namespace probe
