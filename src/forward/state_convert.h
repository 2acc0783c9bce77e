// The canonical host format of a sequence state (CpuSequenceState, forward/state.h) seen from a
// model: the geometry a model expects of a state before importing it (Model::import_state), and
// the snapshot fingerprint of a backend kind (Model::backend_kind). Backends convert their own
// states (CPU: state_convert.cpp, CUDA: gpu_state_io.cpp); the state cache and kvshare only ever
// see the canonical format.
#pragma once
#include <cstdint>
#include <string_view>

#include "core/status.h"
#include "forward/state.h"
#include "model/config.h"

namespace flashseek::forward {

// What a backend keeps in a state beyond what the config fixes.
struct StateGeometry {
  bool draft = false;       // DSpark draft rings, one [ring_size, head_dim] ring per stage
  bool mtp = false;         // V4 MTP window ring and final-stream history
  bool ignore_mtp = false;  // the backend keeps no MTP state: MTP fields are neither checked nor used
  // The backend keeps no DSpark state although the model has a draft (a tensor-parallel rank > 0:
  // rank 0 alone runs the draft and holds its rings): draft rings are neither checked nor used.
  bool ignore_draft = false;
  int64_t max_engram_id = -1;  // largest compressed token id of the Engram look-back; -1: no Engram
};

// Which per-layer arrays of a state layer `l` fills (forward/weights.cpp decides the same from the
// config): compressed-KV rows (one per `ratio` tokens), whether the compressor pools groups (an
// open group and a rollback history of its projections; `overlap`: V4 ratio 4, rows of 2·width
// and a previous window), index-key rows, and V4's indexer compressor (pooled like the compressor).
struct StateLayerShape {
  int64_t ratio = 0;
  bool compressor = false, pooled = false, overlap = false, ikeys = false, icomp = false;
};
StateLayerShape state_layer_shape(const model::ModelConfig& c, int layer);

// Checks that `s` has exactly the shape a model of config `c` (with `g`) leaves after s.len
// tokens, possibly with up to kMaxRollback of them rolled back: ring size, layer count, ring and
// row widths, compressed-KV / index-key row counts, open compressor groups and their rollback
// history, Engram look-back, MTP and DSpark rings. The error names the first field that differs.
// Sizes are compared without arithmetic that could overflow on hostile values.
Status check_state_geometry(const CpuSequenceState& s, const model::ModelConfig& c, const StateGeometry& g);

// Snapshot fingerprint of a model: the checkpoint fingerprint (forward::checkpoint_fingerprint)
// as is for the CPU backend ("cpu": caches written before backend kinds existed stay valid),
// otherwise mixed with the kind, so that a snapshot written by another backend is a fingerprint
// mismatch (recomputed), never a state of slightly different numerics.
uint64_t state_fingerprint(uint64_t checkpoint_fingerprint, std::string_view backend_kind);

}  // namespace flashseek::forward
