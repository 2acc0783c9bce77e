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
#include "forward/state.h"

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

struct DecodedSnapshot {
  SnapshotHeader header;
  std::vector<int32_t> tokens;
  std::unique_ptr<CpuSequenceState> state;
};

// Verifies size, checksum and fingerprint, then rebuilds the state. Any mismatch is an error
// naming what differs; nothing partially decoded is returned. Page references need `source`
// (without one, or for an unknown key, the blob is an error).
Result<DecodedSnapshot> deserialize_snapshot(std::span<const uint8_t> blob,
                                             uint64_t expected_fingerprint,
                                             const PageSource* source = nullptr);

// Keys of the pages a blob references (empty for self-contained blobs); error if it does not
// decode.
Result<std::vector<uint64_t>> snapshot_page_refs(std::span<const uint8_t> blob);

// Identity of a loaded model for snapshot compatibility: xxHash64 over config.json, the numerics
// mode, and per *.safetensors shard (sorted): name, size and its first and last MiB (distinguishes
// random checkpoints of one config without reading whole shards).
Result<uint64_t> checkpoint_fingerprint(const std::string& ckpt_dir, const std::string& numerics);

}  // namespace flashseek::forward
