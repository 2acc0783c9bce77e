// (De)serialisation of a CPU sequence state into one self-checking blob, for the state cache's
// host / disk tiers and for transfers between servers (DESIGN.md §3–§4, issue 6).
//
// Blob layout (little-endian, outermost-first):
//   header  : magic "FSSNAP01", u32 version, u32 reserved, u64 fingerprint, u64 tenant,
//             u64 prefix hash, i64 n_tokens, u64 payload bytes
//   tokens  : [n_tokens] i32 token ids the state holds (lets a reader re-check the key)
//   payload : the CpuSequenceState (len, ring_size, per-layer vectors, Engram history, rings)
//   trailer : u64 xxHash64 of everything before it
// v3 writes paged rows (compressed KV, index keys) page by page: each sealed page is either
// inline or a reference (u64 key) to a page stored once elsewhere, then the private tail. A blob
// with references is "thin": only the state cache's host tier keeps such blobs (the pages live
// in its page store, shared by every snapshot of a conversation); blobs on disk and on the wire
// are self-contained (every page inline). v2 blobs (rows flattened) are still read.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "forward/paged_rows.h"
#include "forward/cache_format.h"
#include "forward/state.h"
#include "model/config.h"

namespace flashseek::forward {

struct SnapshotHeader {
  uint64_t fingerprint = 0;  // model identity (checkpoint_fingerprint); must match to restore
  uint64_t tenant = 0;       // cache scope (API-key hash)
  uint64_t prefix_hash = 0;  // hash chain over (tenant, tokens)
  int64_t n_tokens = 0;
  uint64_t payload_bytes = 0;
};

constexpr size_t kSnapshotHeaderBytes = 8 + 4 + 4 + 8 * 5;

using PagePtr = std::shared_ptr<const PagedRows::Page>;
// Called for each sealed page while serialising: the key to reference it by (the callee keeps
// the page), or nullopt to write it inline.
using PageSink = std::function<std::optional<uint64_t>(const PagePtr& page)>;
// Resolves a reference while decoding; nullptr when the key is unknown (the blob is unusable).
using PageSource = std::function<const PagedRows::Page*(uint64_t key)>;

// Serialises `state` (must be a CpuSequenceState holding exactly tokens.size() tokens). Without
// a sink every page is inline (self-contained blob).
Result<std::vector<uint8_t>> serialize_snapshot(const SequenceState& state,
                                                std::span<const int32_t> tokens,
                                                const SnapshotHeader& header,
                                                const PageSink* sink = nullptr);

// Reads only the header (no checksum check): cheap index rebuild from a cache directory.
Result<SnapshotHeader> peek_snapshot_header(std::span<const uint8_t> blob);

// The shape every decoded state must have to be used with one loaded model (layer count, ring
// size, vector sizes, paged-row widths and counts, compressor partial groups, Engram / MTP /
// DSpark parts), derived from its config. A state from any source (peer, disk, memory) that does
// not fit is rejected before the model touches it: the forward pass indexes rings and rows by
// these sizes, so a wrong one would read or write out of bounds.
struct SnapshotGeometry {
  struct Rows {            // a PagedRows object
    int64_t width = 0;     // floats per row
    int64_t ratio = 0;     // rows = len / ratio; 0: always empty
  };
  struct Compressor {      // a CompressorState
    int64_t ratio = 0;     // tokens per group; 0: unused (every field empty / zero)
    int64_t width = 0;     // floats per pending row
    bool overlap = false;  // keeps the previous window (V4 ratio 4)
  };
  struct Layer {
    Rows ckv, ikeys;
    Compressor comp, icomp;
  };
  int64_t vocab_size = 0;  // token ids in [0, vocab_size)
  int64_t max_tokens = 0;  // longest state accepted (the serving context)
  int64_t ring_size = 0;   // window + kMaxRollback
  int64_t ring_width = 0;  // floats per ring slot (head_dim)
  std::vector<Layer> layers;
  int64_t engram_min = 0, engram_keep = 0;  // history length bounds; keep 0: no Engram
  int64_t engram_vocab = 0;                 // compressed ids in [0, engram_vocab)
  int64_t mtp_row = 0;       // floats per MTP history row (hc·hidden); 0: no MTP block
  int64_t draft_stages = 0;  // DSpark rings (each ring_size · ring_width)
};

// Geometry of a model's states: has_mtp / has_dspark say whether the loaded weights carry the V4
// MTP block / the V4.1 DSpark stages (their rings exist only then).
SnapshotGeometry snapshot_geometry(const model::ModelConfig& config, bool has_mtp, bool has_dspark,
                                   int64_t max_tokens);
// The same from a checkpoint directory (config + tensor names, no weights read). max_tokens 0:
// the config's max_position_embeddings.
Result<SnapshotGeometry> checkpoint_snapshot_geometry(const std::string& ckpt_dir,
                                                      int64_t max_tokens = 0);
// Geometry of the states `model` exports (Model::export_state): its config, with the MTP (V4) or
// DSpark (V4.1) rings when the model keeps a draft (has_draft(); both backends keep V4's MTP
// state, the CUDA one on one GPU). max_tokens 0: the config's max_position_embeddings.
SnapshotGeometry model_snapshot_geometry(const Model& model, int64_t max_tokens = 0);
// OK when `state` has exactly the shape `g` prescribes for its length; else an error naming the
// first field that differs.
Status validate_state(const CpuSequenceState& state, const SnapshotGeometry& g);
// Upper bound of a self-contained blob of a state of `g` (max_tokens tokens): larger blobs are
// refused before anything is allocated (cache files, peer transfers).
uint64_t max_snapshot_bytes(const SnapshotGeometry& g);

// Bytes of one sequence state of `tokens` tokens, by part (each part belongs to one layer role:
// window rings to every layer and draft stage, compressed KV to kv-source layers, index keys to
// index sources, compressor partial groups to compressing sources; other = Engram history and
// the V4 MTP history). kFp32: the layout both backends allocate today (FP32 rings, rows and
// partials; rows counted without page rounding). kCompact: perf-budget.md §2 (ring rows e4m3 +
// E8M0 per 32, compressed KV FP4 + E4M3 per 16, index keys FP4 + E8M0 per 32, partials FP32).
enum class StateFormat { kFp32, kCompact };
struct StateBytes {
  uint64_t rings = 0, compressed_kv = 0, index_keys = 0, compressors = 0, other = 0;
  uint64_t total() const { return rings + compressed_kv + index_keys + compressors + other; }
};
StateBytes sequence_state_bytes(const SnapshotGeometry& g, int64_t tokens, StateFormat format);
// The same with the caches in the row formats `f` (forward/cache_format.h): what the CUDA
// backend allocates (window rings, compressed KV and index keys in their formats; DSpark / MTP
// rings and compressor partials FP32).
StateBytes sequence_state_bytes(const SnapshotGeometry& g, int64_t tokens, const CacheFormats& f);

struct DecodedSnapshot {
  SnapshotHeader header;
  std::vector<int32_t> tokens;
  std::unique_ptr<CpuSequenceState> state;
};

// Verifies size, checksum and fingerprint, rebuilds the state and checks it against `geometry`
// (validate_state) and its token ids against the vocabulary. Any mismatch is an error naming what
// differs; nothing partially decoded is returned. Page references need `source` (without one,
// or for an unknown key, the blob is an error).
Result<DecodedSnapshot> deserialize_snapshot(std::span<const uint8_t> blob,
                                             uint64_t expected_fingerprint,
                                             const SnapshotGeometry& geometry,
                                             const PageSource* source = nullptr);

// Keys of the pages a blob references (empty for self-contained blobs); error if it does not
// decode.
Result<std::vector<uint64_t>> snapshot_page_refs(std::span<const uint8_t> blob);

// Identity of a loaded model for snapshot compatibility: xxHash64 over config.json, the numerics
// mode, and per *.safetensors shard (sorted): name, size and its first and last MiB (distinguishes
// random checkpoints of one config without reading whole shards).
Result<uint64_t> checkpoint_fingerprint(const std::string& ckpt_dir, const std::string& numerics);

}  // namespace flashseek::forward
