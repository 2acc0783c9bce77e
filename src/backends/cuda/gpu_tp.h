// Multi-GPU tensor + expert parallel model (`--gpus 0,1,...`, docs/multigpu.md). One rank = one
// GpuModel on one device holding a slice of the weights:
//  - attention: heads [head0, head0 + heads) (wq_b rows, attn_sink) and output groups
//    [group0, group0 + groups) (wo_a rows, wo_b input columns); the rank's wo_b output is a
//    partial sum, all-reduced. KV, compressors, indexer, mHC and norms are replicated.
//  - MoE: routing replicated; routed experts [expert0, expert0 + experts) (expert parallel, slots
//    routed elsewhere contribute zero); the shared expert on rank 0; the combine is all-reduced.
//  - LM head: vocabulary rows [vocab0, vocab0 + vocab); the slices are gathered on the host.
// Native weights (the default): each rank uploads the stored bytes of its slices only (tp_slice_for,
// backends/cuda/stored_slice.h); a slice that does not cover whole scale blocks goes up as an FP32
// copy of the slice (one log line). GpuWeights::kFp32 (debug): FP32 copies sliced on the host.
// Engram tables as on one GPU (host rows gathered by every rank, or on every device as stored).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "core/status.h"
#include "forward/model.h"
#include "forward/weights.h"
#include "model/config.h"

namespace flashseek::forward {

// What one rank of a tensor/expert-parallel model owns.
struct TpShard {
  int rank = 0, world = 1;
  int64_t head0 = 0, heads = 0;      // attention heads
  int64_t group0 = 0, groups = 0;    // output projection groups (o_groups)
  int64_t expert0 = 0, experts = 0;  // routed experts
  int64_t vocab0 = 0, vocab = 0;     // LM head rows (the last ranks may hold one row fewer)
  bool shared_expert = true;         // rank 0 computes the shared expert
  bool split() const { return world > 1; }
};

// Rank `rank` of `world`. Heads, output groups and routed experts must divide evenly, and in
// reference numerics the FP8 activation blocks of wo_b's input must not straddle two ranks; the
// vocabulary may split unevenly. Errors name the field and the sizes.
Result<TpShard> make_tp_shard(const model::ModelConfig& c, Numerics numerics, int rank, int world);

// Cuts the backbone weights down to `s` (host arrays, before upload): wq_b rows, attn_sink,
// wo_a rows, wo_b columns, routed experts, the shared expert (dropped on ranks > 0), head rows.
// Matrices left empty by the loader (native weights: uploaded from the checkpoint by tp_slice_for)
// stay empty; the routed expert lists shrink to the rank's experts all the same.
Status shard_weights(ModelWeights& w, const model::ModelConfig& c, const TpShard& s);

// What rank `s` keeps of checkpoint matrix `name` (native weights: the stored bytes it uploads).
struct TpSlice {
  enum Kind {
    kAll,   // replicated (or a one-GPU model)
    kRows,  // rows [start, start + count)
    kCols,  // columns [start, start + count)
    kNone,  // another rank's routed expert, or the shared expert or the draft on ranks > 0: never read
  } kind = kAll;
  int64_t start = 0, count = 0;
};
// The backbone's split matrices (layers.N.attn.wq_b / wo_a / wo_b, layers.N.ffn.experts.E.*,
// layers.N.ffn.shared_experts.*, head.weight) as shard_weights cuts them, and the draft (mtp.*:
// whole on rank 0, kNone on the other ranks, as shard_weights drops it); kAll for every other
// name and for a shard that does not split.
TpSlice tp_slice_for(const std::string& name, const model::ModelConfig& c, const TpShard& s);

// The backend kind (Model::backend_kind; it enters the snapshot fingerprint, state_convert.h) of a
// CUDA model: "cuda" (FP32 copies, or native weights read by the exactness kernels, which give the
// same bits) or "cuda-native" (block-scaled GEMVs: reference numerics with native weights); over
// `world` > 1 ranks "-tp<world>" is appended, because the all-reduced partial sums (wo_b, the MoE
// combine) change the FP32 summation order with the world size, and "-host" when the ranks share
// a host-staged communicator (it sums in rank order; NCCL's order may differ from 4 ranks on).
// So a snapshot is only restored on a model that continues it bit for bit.
std::string cuda_backend_kind(bool block_scaled, int world, std::string_view comm);

// "0,1" → {0, 1}. Errors for empty items, non-numbers, negative ids.
Result<std::vector<int>> parse_gpu_list(const std::string& gpus);

// Runs fn(r) for every rank r at once (`devices`: one entry per rank, named in errors): ranks > 0
// on a host thread each, rank 0 on the caller's thread, and returns only after every thread has
// joined. An exception thrown by fn, or a thread that cannot be started, becomes that rank's error.
// on_fail(r), when given, runs as soon as rank r has failed (TpModel::forward aborts the
// communicators there, so that the ranks waiting in a collective return). Returns the first
// failing rank's error with the context "<what>: rank r of W (device d)"; a kCancelled error (a
// rank woken by another's abort) is returned only when no rank failed otherwise.
Status for_each_rank(std::string_view what, const std::vector<int>& devices, const std::function<Status(size_t)>& fn,
                     const std::function<void(size_t)>& on_fail = {});

// Loads one rank per entry of `devices` and returns the combined model (rank 0's config; logits
// of the full vocabulary). opts.tp_comm picks the collectives (TpComm, gpu_model.h); opts.graphs
// applies to every rank.
Result<std::unique_ptr<Model>> load_model_tp(const std::string& ckpt_dir, Numerics numerics,
                                             const std::vector<int>& devices, const GpuLoadOptions& opts = {});

// The weight bytes one CUDA rank holds on its device (GpuModel's weight report).
struct GpuWeightBytes {
  int64_t stored = 0;            // matrices kept as stored: device bytes (codes + scales)
  int64_t checkpoint = 0;        // the checkpoint bytes of those matrices (a rank: of its slices)
  int64_t stored_matrices = 0;   // (routed experts: one per expert)
  int64_t fp32 = 0;              // FP32 copies: vectors, tables, fallback matrices (fp32 mode: all)
  int64_t fallback = 0;          // of which native matrices (or slices) that went up as FP32 copies
  int64_t fallback_matrices = 0;
};
// One entry per rank of a multi-GPU model; one entry for a one-GPU CUDA model; an error otherwise.
Result<std::vector<GpuWeightBytes>> gpu_rank_weight_bytes(const Model& m);

// Every rank's own export of a multi-GPU sequence state (GpuModel::export_state of rank r on its
// device; ranks > 0 hold no draft state). TpModel::export_state is rank 0's: the replicated parts
// (KV rings, compressed KV, index keys, compressors, Engram look-back) are the same bits on every
// rank, which this lets tests check. An error for other models or states.
Result<std::vector<std::unique_ptr<CpuSequenceState>>> tp_rank_states(const Model& m, const SequenceState& state);

struct GpuGraphStats;  // backends/cuda/gpu_model.h
// The CUDA-graph counters of each rank of a multi-GPU model (gpu_graph_stats sums them); one entry
// for a one-GPU CUDA model.
Result<std::vector<GpuGraphStats>> gpu_graph_rank_stats(const Model& m);

}  // namespace flashseek::forward
