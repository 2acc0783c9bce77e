// The first statement of every kernel launched through launch_kernel* (runtime/launch.cuh), which
// may launch it with programmatic dependent launch (PDL): `griddepcontrol.launch_dependents` lets
// the next kernel on the stream be scheduled as soon as every block of this one has started, and
// `griddepcontrol.wait` holds this kernel until the previous grid has completed and its memory is
// visible. So nothing here reads or writes memory before its predecessors are done: the results
// are those of plain stream order, and what PDL overlaps is only the launch and block scheduling.
// Without PDL (or before sm_90) both instructions are no-ops.
// Data that a recent kernel writes is read with plain loads: ld.global.nc (__ldg, and what nvcc
// emits for const __restrict__ pointers) is defined only for data read-only over the kernel's
// lifetime, which PDL's overlap breaks, and is not guaranteed to stay behind the wait (a batched
// __ldg of the attention's q read stale rows). ld_weight below is for weights and other data no
// kernel of the step writes.
#pragma once

#include <type_traits>

namespace flashseek::ops::cuda {

// With an argument, the function runs between the two and its result is returned: it may only
// read data that no kernel of the step writes (weights, with ld_weight), e.g. request a weight
// tile while the previous kernel ends.
template <class F>
__device__ __forceinline__ auto pdl_prologue(F&& before_wait) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if constexpr (std::is_void_v<decltype(before_wait())>) {
    before_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  } else {
    auto v = before_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    return v;
  }
}

__device__ __forceinline__ void pdl_prologue() {
  pdl_prologue([] {});
}

// The read-only (non-coherent, ld.global.nc) load: for weights and tables uploaded at load time
// only, never for data a kernel of the step writes (see above). The only __ldg of src/ops/cuda
// (scripts/check_nc_loads.py).
template <class T>
__device__ __forceinline__ T ld_weight(const T* p) {
  return __ldg(p);
}

}  // namespace flashseek::ops::cuda
