// Collectives between the ranks of a tensor/expert-parallel model (backends/cuda/gpu_tp.h): one rank per
// host thread, all in one process. Two implementations behind one interface:
//  - NCCL (make_nccl_comms): one rank per device, ncclCommInitAll; NCCL_NVLS_ENABLE is forced to 0
//    before the communicators are made (NVLink multicast stays off on the lent machines).
//  - host-staged (make_host_comms): device → host copy, sum in rank order on the host, host →
//    device copy. Slow, but any ranks may share one device (NCCL refuses two ranks on one GPU), so
//    the split logic is testable on a single-GPU machine.
// Every call is collective: all ranks of a group call the same sequence of operations with the
// same sizes. Sums run in rank order, so every rank ends with bit-identical results.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::ops::cuda {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string kind() const = 0;  // "nccl" or "host"
  // x[0, n) ← Σ over ranks of x[0, n) (device pointer, in place, ordered on stream s).
  virtual Status allreduce_sum(float* x, int64_t n, cudaStream_t s) = 0;
  // recv [world, n] ← every rank's send [n] (device pointers, ordered on stream s).
  virtual Status allgather(const float* send, int64_t n, float* recv, cudaStream_t s) = 0;
  // Host-side vote (no device work; collective like the others): `all` becomes the AND and `any`
  // the OR of the ranks' values, so that every rank takes the same decision (e.g. replay a patched
  // CUDA graph or record the step: ranks that disagree would deadlock in NCCL).
  virtual Status vote(bool& all, bool& any) = 0;
  // Wakes every rank blocked in a collective of this group with an error (a failed rank calls it
  // so that the others do not wait forever); the group is unusable afterwards.
  virtual void abort() = 0;
  // After every rank has returned from an aborted step: makes the group usable again.
  virtual void recover() = 0;
};

// The launch-tape op (ops/cuda/launch.cuh TapeOp::kind) of an NCCL collective queued while the
// tape is on. Patch mode: the communicator appends it instead of calling NCCL (the collective's
// nodes in the recorded graph stay as captured, never patched); record mode: NCCL is captured and
// the op notes how many graph nodes it added (TapeOp::grid.x). Its dst / src / count / aux (the
// collective) / dpitch (the communicator) must equal the recorded ones for the graph to be replayed.
inline constexpr uint8_t kTapeCollective = 4;

// A host-staged group of `world` ranks (threads of this process; devices may repeat).
Result<std::vector<std::unique_ptr<Communicator>>> make_host_comms(int world);

// True when this build links NCCL (FLASHSEEK_HAVE_NCCL).
bool nccl_built();
// An NCCL group with one rank per entry of `devices` (distinct CUDA devices).
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_comms(const std::vector<int>& devices);

namespace detail {
// Expert-parallel remap of the routing (comm.cu): slots whose expert lies in [e0, e0 + n) get the
// local index sel − e0; the others point at local expert 0 with weight 0 (they contribute zero).
cudaError_t launch_tp_remap_experts(int32_t* sel, float* weight, int64_t n, int32_t e0, int32_t n_local,
                                    cudaStream_t s);
}  // namespace detail

}  // namespace flashseek::ops::cuda
