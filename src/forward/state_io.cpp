#include "forward/state_io.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/checkpoint.h"

namespace flashseek::forward {

namespace {

constexpr char kMagic[8] = {'F', 'S', 'S', 'N', 'A', 'P', '0', '1'};
constexpr uint32_t kVersion = 3;  // v3: paged rows page by page (inline or referenced)
constexpr uint32_t kOldestVersion = 2;  // v2: paged rows flat (width, rows_per_page, floats)
constexpr uint8_t kPageInline = 0, kPageRef = 1;
// A field added to the state must be added to write_state/read_state too: these sizes are the
// layouts the (de)serialiser was written for (vector = 24 B, CompressorState = 6 vectors + 3,
// PagedRows = 2 i64 + 2 vectors).
static_assert(sizeof(CompressorState) == 6 * 24 + 3 * 8, "CompressorState changed: update state_io");
static_assert(sizeof(PagedRows) == 2 * 8 + 2 * 24, "PagedRows changed: update state_io");
static_assert(sizeof(LayerState) == 24 + 2 * sizeof(PagedRows) + 2 * sizeof(CompressorState),
              "LayerState changed: update state_io");
static_assert(sizeof(CpuSequenceState) == 8 + 2 * 8 + 5 * 24, "CpuSequenceState changed: update state_io");

// Guards against absurd counts in a corrupt blob before anything is allocated.
constexpr uint64_t kMaxLayers = 4096;
// Bounds a corrupt paged-rows geometry (one page is rows_per_page · width floats).
constexpr uint64_t kMaxPageFloats = uint64_t(1) << 24;

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out, const PageSink* sink = nullptr)
      : out_(out), sink_(sink) {}
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  template <typename T>
  void pod(T v) { raw(&v, sizeof(T)); }
  void floats(const std::vector<float>& v) {
    pod<uint64_t>(v.size());
    raw(v.data(), v.size() * sizeof(float));
  }
  // Paged rows (v3): width, rows_per_page, number of sealed pages, each page as a kind byte and
  // either its rows_per_page·width floats or a u64 key from the sink, then the tail floats.
  void rows(const PagedRows& p) {
    pod<uint64_t>(uint64_t(p.width()));
    pod<uint64_t>(uint64_t(p.rows_per_page()));
    const auto view = p.pages();
    pod<uint64_t>(view.full.size());
    for (const PagePtr& page : view.full) {
      const std::optional<uint64_t> key = sink_ ? (*sink_)(page) : std::nullopt;
      if (key) {
        pod<uint8_t>(kPageRef);
        pod<uint64_t>(*key);
      } else {
        pod<uint8_t>(kPageInline);
        raw(page->data.data(), page->data.size() * sizeof(float));
      }
    }
    pod<uint64_t>(view.tail.size());
    raw(view.tail.data(), view.tail.size() * sizeof(float));
  }

 private:
  std::vector<uint8_t>& out_;
  const PageSink* sink_;
};

class Reader {
 public:
  // version: the blob's format; source resolves page references (v3); refs collects their keys.
  Reader(std::span<const uint8_t> in, uint32_t version = kVersion,
         const PageSource* source = nullptr, std::vector<uint64_t>* refs = nullptr)
      : in_(in), version_(version), source_(source), refs_(refs) {}
  bool raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    if (n == 0) return true;  // p may be null (an empty vector's data())
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool pod(T& v) { return raw(&v, sizeof(T)); }
  bool floats(std::vector<float>& v) {
    uint64_t n = 0;
    if (!pod(n) || n > (in_.size() - pos_) / sizeof(float)) return false;
    v.resize(size_t(n));
    return raw(v.data(), size_t(n) * sizeof(float));
  }
  bool rows(PagedRows& p) {
    uint64_t width = 0, rpp = 0;
    if (!(pod(width) && pod(rpp))) return false;
    if (width == 0 || rpp == 0 || rpp > kMaxPageFloats / width) return false;
    p.reset(int64_t(width), int64_t(rpp));
    std::vector<float> flat;
    if (version_ == 2) {
      if (!floats(flat) || flat.size() % width != 0) return false;
      p.append(flat);
      return true;
    }
    const size_t page_floats = size_t(width * rpp);
    uint64_t n_pages = 0;
    if (!pod(n_pages) || n_pages > (in_.size() - pos_) / 9) return false;  // ≥ 9 B per page
    for (uint64_t i = 0; i < n_pages; ++i) {
      uint8_t kind = 0;
      if (!pod(kind)) return false;
      if (kind == kPageInline) {
        if (page_floats > (in_.size() - pos_) / sizeof(float)) return false;
        page_.resize(page_floats);  // aligned copy: the page sits after a kind byte
        if (!raw(page_.data(), page_floats * sizeof(float))) return false;
        p.append(page_.data(), int64_t(rpp));
      } else if (kind == kPageRef) {
        uint64_t key = 0;
        if (!pod(key)) return false;
        if (refs_) refs_->push_back(key);
        if (!refs_) {
          const PagedRows::Page* page = source_ ? (*source_)(key) : nullptr;
          if (!page || page->data.size() != page_floats) return false;
          p.append(page->data.data(), int64_t(rpp));
        }
      } else {
        return false;
      }
    }
    if (!floats(flat) || flat.size() % width != 0 || flat.size() >= page_floats) return false;
    p.append(flat);
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  uint32_t version_;
  const PageSource* source_;
  std::vector<uint64_t>* refs_;  // collecting keys only: references are not resolved
  std::vector<float> page_;
};

void write_comp(Writer& w, const CompressorState& c) {
  w.floats(c.v);
  w.floats(c.z);
  w.floats(c.prev_v);
  w.floats(c.prev_z);
  w.pod<int64_t>(c.n_pend);
  w.pod<uint8_t>(c.has_prev ? 1 : 0);
  w.floats(c.hist_v);
  w.floats(c.hist_z);
  w.pod<int64_t>(c.hist_first);
}

bool read_comp(Reader& r, CompressorState& c) {
  uint8_t has_prev = 0;
  if (!(r.floats(c.v) && r.floats(c.z) && r.floats(c.prev_v) && r.floats(c.prev_z) &&
        r.pod(c.n_pend) && r.pod(has_prev) && r.floats(c.hist_v) && r.floats(c.hist_z) &&
        r.pod(c.hist_first)))
    return false;
  c.has_prev = has_prev != 0;
  return true;
}

void write_state(Writer& w, const CpuSequenceState& s) {
  w.pod<int64_t>(s.len);
  w.pod<int64_t>(s.ring_size);
  w.pod<uint64_t>(s.layers.size());
  for (const auto& l : s.layers) {
    w.floats(l.ring);
    w.rows(l.ckv);
    w.rows(l.ikeys);
    write_comp(w, l.comp);
    write_comp(w, l.icomp);
  }
  w.pod<uint64_t>(s.engram_hist.size());
  w.raw(s.engram_hist.data(), s.engram_hist.size() * sizeof(int64_t));
  w.floats(s.mtp_ring);
  w.floats(s.mtp_hist_x);
  w.pod<uint64_t>(s.draft_rings.size());
  for (const auto& d : s.draft_rings) w.floats(d);
}

bool read_state(Reader& r, CpuSequenceState& s, size_t remaining) {
  uint64_t n_layers = 0, n_hist = 0, n_draft = 0;
  if (!(r.pod(s.len) && r.pod(s.ring_size) && r.pod(n_layers)) || n_layers > kMaxLayers)
    return false;
  s.layers.resize(size_t(n_layers));
  for (auto& l : s.layers)
    if (!(r.floats(l.ring) && r.rows(l.ckv) && r.rows(l.ikeys) && read_comp(r, l.comp) &&
          read_comp(r, l.icomp)))
      return false;
  if (!r.pod(n_hist) || n_hist > remaining / sizeof(int64_t)) return false;
  s.engram_hist.resize(size_t(n_hist));
  if (!r.raw(s.engram_hist.data(), size_t(n_hist) * sizeof(int64_t))) return false;
  if (!r.floats(s.mtp_ring) || !r.floats(s.mtp_hist_x)) return false;
  if (!r.pod(n_draft) || n_draft > kMaxLayers) return false;
  s.draft_rings.resize(size_t(n_draft));
  for (auto& d : s.draft_rings)
    if (!r.floats(d)) return false;
  return true;
}

bool read_header(Reader& r, SnapshotHeader& h, uint32_t& version) {
  char magic[8];
  uint32_t reserved = 0;
  if (!r.raw(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return false;
  return r.pod(version) && r.pod(reserved) && r.pod(h.fingerprint) && r.pod(h.tenant) &&
         r.pod(h.prefix_hash) && r.pod(h.n_tokens) && r.pod(h.payload_bytes);
}

}  // namespace

Result<std::vector<uint8_t>> serialize_snapshot(const SequenceState& state,
                                                std::span<const int32_t> tokens,
                                                const SnapshotHeader& header,
                                                const PageSink* sink) {
  const auto* s = dynamic_cast<const CpuSequenceState*>(&state);
  if (!s) return invalid_argument("snapshot: only CPU sequence states can be serialised");
  if (s->len != int64_t(tokens.size()))
    return invalid_argument("snapshot: state holds {} tokens but {} token ids were given", s->len,
                            tokens.size());
  std::vector<uint8_t> payload;
  Writer pw(payload, sink);
  write_state(pw, *s);

  std::vector<uint8_t> out;
  out.reserve(kSnapshotHeaderBytes + tokens.size_bytes() + payload.size() + 8);
  Writer w(out);
  w.raw(kMagic, 8);
  w.pod<uint32_t>(kVersion);
  w.pod<uint32_t>(0);
  w.pod(header.fingerprint);
  w.pod(header.tenant);
  w.pod(header.prefix_hash);
  w.pod<int64_t>(int64_t(tokens.size()));
  w.pod<uint64_t>(payload.size());
  w.raw(tokens.data(), tokens.size_bytes());
  w.raw(payload.data(), payload.size());
  w.pod<uint64_t>(XXH64(out.data(), out.size(), 0));
  return out;
}

Result<SnapshotHeader> peek_snapshot_header(std::span<const uint8_t> blob) {
  Reader r(blob);
  SnapshotHeader h;
  uint32_t version = 0;
  if (!read_header(r, h, version)) return parse_error("snapshot: bad or truncated header");
  if (version < kOldestVersion || version > kVersion)
    return parse_error("snapshot: version {} (this build reads {}..{})", version, kOldestVersion,
                       kVersion);
  return h;
}

namespace {

// Checks the framing and checksum; the payload's version and offset.
Result<std::pair<uint32_t, size_t>> check_blob(std::span<const uint8_t> blob,
                                               const SnapshotHeader& h) {
  if (h.n_tokens < 0 || uint64_t(h.n_tokens) > blob.size() / 4 || h.payload_bytes > blob.size())
    return parse_error("snapshot: token count {} / payload {} B exceed the blob ({} B)",
                       h.n_tokens, h.payload_bytes, blob.size());
  const uint64_t want = kSnapshotHeaderBytes + uint64_t(h.n_tokens) * 4 + h.payload_bytes + 8;
  if (blob.size() != want)
    return parse_error("snapshot: size {} B, header says {} B", blob.size(), want);
  uint64_t stored = 0;
  std::memcpy(&stored, blob.data() + blob.size() - 8, 8);
  if (XXH64(blob.data(), blob.size() - 8, 0) != stored)
    return parse_error("snapshot: checksum mismatch (corrupt data)");
  uint32_t version = 0;
  std::memcpy(&version, blob.data() + 8, 4);
  return std::make_pair(version, size_t(kSnapshotHeaderBytes + uint64_t(h.n_tokens) * 4));
}

}  // namespace

Result<std::vector<uint64_t>> snapshot_page_refs(std::span<const uint8_t> blob) {
  FS_ASSIGN_OR_RETURN(SnapshotHeader h, peek_snapshot_header(blob));
  FS_ASSIGN_OR_RETURN(auto vp, check_blob(blob, h));
  std::vector<uint64_t> refs;
  Reader r(blob.subspan(vp.second, size_t(h.payload_bytes)), vp.first, nullptr, &refs);
  CpuSequenceState st;
  if (!read_state(r, st, size_t(h.payload_bytes)) || r.pos() != h.payload_bytes)
    return parse_error("snapshot: payload does not decode as a sequence state");
  return refs;
}

Result<DecodedSnapshot> deserialize_snapshot(std::span<const uint8_t> blob,
                                             uint64_t expected_fingerprint,
                                             const SnapshotGeometry& geometry,
                                             const PageSource* source) {
  FS_ASSIGN_OR_RETURN(SnapshotHeader h, peek_snapshot_header(blob));
  FS_ASSIGN_OR_RETURN(auto vp, check_blob(blob, h));
  if (h.fingerprint != expected_fingerprint)
    return invalid_argument("snapshot: model fingerprint {:016x} differs from this model's {:016x}",
                            h.fingerprint, expected_fingerprint);
  DecodedSnapshot d;
  d.header = h;
  d.tokens.resize(size_t(h.n_tokens));
  if (!d.tokens.empty())  // (an empty vector's data() may be null: memcpy's pointers must not be)
    std::memcpy(d.tokens.data(), blob.data() + kSnapshotHeaderBytes, d.tokens.size() * 4);
  const size_t payload_at = vp.second;
  Reader r(blob.subspan(payload_at, size_t(h.payload_bytes)), vp.first, source);
  d.state = std::make_unique<CpuSequenceState>();
  if (!read_state(r, *d.state, size_t(h.payload_bytes)) || r.pos() != h.payload_bytes)
    return parse_error("snapshot: payload does not decode as a sequence state (or references "
                       "pages that are not available)");
  if (d.state->len != h.n_tokens)
    return parse_error("snapshot: state length {} differs from its {} tokens", d.state->len,
                       h.n_tokens);
  for (int32_t t : d.tokens)
    if (t < 0 || t >= geometry.vocab_size)
      return invalid_argument("snapshot: token id {} outside the vocabulary [0, {})", t,
                              geometry.vocab_size);
  FS_RETURN_IF_ERROR(validate_state(*d.state, geometry));
  return d;
}

SnapshotGeometry snapshot_geometry(const model::ModelConfig& c, bool has_mtp, bool has_dspark,
                                   int64_t max_tokens) {
  SnapshotGeometry g;
  g.vocab_size = c.vocab_size;
  g.max_tokens = max_tokens;
  g.ring_size = c.window + kMaxRollback;
  g.ring_width = c.head_dim;
  const bool v41 = c.is_v41();
  const int64_t Dh = c.head_dim, dI = c.index_head_dim;
  g.layers.resize(size_t(std::max<int64_t>(c.num_layers, 0)));
  for (int l = 0; l < int(g.layers.size()); ++l) {
    // Mirrors forward/weights.cpp (which compressor / indexer a layer loads) and flow.cpp
    // (compress_seg: what each one appends per token).
    const auto& role = c.role(l);
    auto& L = g.layers[size_t(l)];
    L.ckv.width = Dh;  // new_sequence() gives every layer both objects, empty when unused
    L.ikeys.width = dI;
    const int64_t r = role.ratio;
    if (r <= 0) continue;
    if (v41) {
      if (!role.kv_source) continue;
      L.ckv.ratio = r;
      if (role.index_source) L.ikeys.ratio = r;
      if (r > 1) L.comp = {r, Dh, false};  // ratio 1 is a plain projection: no partial group
    } else {
      const bool overlap = r == 4;
      const int64_t coff = overlap ? 2 : 1;
      L.ckv.ratio = r;
      L.comp = {r, coff * Dh, overlap};
      if (overlap) {
        L.ikeys.ratio = r;
        L.icomp = {r, coff * dI, overlap};
      }
    }
  }
  if (v41 && !c.engram_layer_ids.empty()) {
    g.engram_min = c.engram_max_ngram_size - 1;
    g.engram_keep = c.engram_max_ngram_size - 1 + kMaxRollback;
    g.engram_vocab = c.engram_compressed_vocab_size > 0 ? c.engram_compressed_vocab_size
                                                        : c.vocab_size;
  }
  if (has_mtp) g.mtp_row = c.hc_mult * c.hidden_size;
  if (has_dspark) g.draft_stages = c.num_mtp_layers;
  return g;
}

Result<SnapshotGeometry> checkpoint_snapshot_geometry(const std::string& ckpt_dir,
                                                      int64_t max_tokens) {
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(ckpt_dir, /*validate=*/false));
  const model::ModelConfig& c = ck.config();
  // Same conditions as forward/weights.cpp for the optional blocks.
  const bool has_mtp = !c.is_v41() && c.num_mtp_layers > 0 && ck.has("mtp.0.e_proj.weight");
  const bool has_dspark = c.is_v41() && c.num_mtp_layers > 0 && ck.has("mtp.0.main_proj.weight");
  return snapshot_geometry(c, has_mtp, has_dspark,
                           max_tokens > 0 ? max_tokens : c.max_position_embeddings);
}

SnapshotGeometry model_snapshot_geometry(const Model& model, int64_t max_tokens) {
  const model::ModelConfig& c = model.config();
  const bool draft = model.has_draft();
  return snapshot_geometry(c, draft && !c.is_v41(), draft && c.is_v41(),
                           max_tokens > 0 ? max_tokens : c.max_position_embeddings);
}

namespace {

Status check_size(const char* what, int layer, size_t got, int64_t want) {
  if (int64_t(got) == want) return {};
  if (layer >= 0)
    return invalid_argument("snapshot: layer {} {} holds {} values, this model needs {}", layer,
                            what, got, want);
  return invalid_argument("snapshot: {} holds {} values, this model needs {}", what, got, want);
}

Status check_rows(const char* what, int layer, const PagedRows& p, const SnapshotGeometry::Rows& g,
                  int64_t len) {
  if (p.width() != g.width)
    return invalid_argument("snapshot: layer {} {} rows are {} wide, this model needs {}", layer,
                            what, p.width(), g.width);
  const int64_t want = g.ratio > 0 ? len / g.ratio : 0;
  if (p.size() != want)
    return invalid_argument("snapshot: layer {} {} holds {} rows for {} tokens, this model needs {}",
                            layer, what, p.size(), len, want);
  return {};
}

Status check_comp(const char* what, int layer, const CompressorState& c,
                  const SnapshotGeometry::Compressor& g, int64_t len) {
  auto bad = [&](const std::string& why) {
    return invalid_argument("snapshot: layer {} {}: {}", layer, what, why);
  };
  if (g.ratio <= 0) {
    if (!c.v.empty() || !c.z.empty() || !c.prev_v.empty() || !c.prev_z.empty() || c.n_pend != 0 ||
        c.has_prev || !c.hist_v.empty() || !c.hist_z.empty() || c.hist_first != 0)
      return bad("holds data, this model has no such compressor");
    return {};
  }
  const int64_t w = g.width;
  if (c.n_pend != len % g.ratio)
    return bad(fmt::format("{} pending tokens, {} tokens need {}", c.n_pend, len, len % g.ratio));
  if (int64_t(c.v.size()) != c.n_pend * w || int64_t(c.z.size()) != c.n_pend * w)
    return bad(fmt::format("open group holds {} / {} values, needs {}", c.v.size(), c.z.size(),
                           c.n_pend * w));
  const bool want_prev = g.overlap && len >= g.ratio;
  if (c.has_prev != want_prev) return bad("previous-window flag does not match the length");
  const int64_t prev = want_prev ? g.ratio * w : 0;
  if (int64_t(c.prev_v.size()) != prev || int64_t(c.prev_z.size()) != prev)
    return bad(fmt::format("previous window holds {} / {} values, needs {}", c.prev_v.size(),
                           c.prev_z.size(), prev));
  const int64_t keep = 2 * g.ratio + kMaxRollback;
  if (c.hist_v.size() != c.hist_z.size() || int64_t(c.hist_v.size()) % w != 0)
    return bad("history rows have the wrong width");
  const int64_t n_hist = int64_t(c.hist_v.size()) / w;
  if (n_hist > std::min(len, keep) || c.hist_first != len - n_hist)
    return bad(fmt::format("history of {} rows from position {} does not end at {}", n_hist,
                           c.hist_first, len));
  return {};
}

}  // namespace

Status validate_state(const CpuSequenceState& s, const SnapshotGeometry& g) {
  const int64_t len = s.len;
  if (len < 0 || len > g.max_tokens)
    return invalid_argument("snapshot: {} tokens, this server accepts at most {}", len,
                            g.max_tokens);
  if (s.ring_size != g.ring_size)
    return invalid_argument("snapshot: ring size {}, this model needs {}", s.ring_size,
                            g.ring_size);
  if (s.layers.size() != g.layers.size())
    return invalid_argument("snapshot: {} layers, this model has {}", s.layers.size(),
                            g.layers.size());
  const int64_t ring = g.ring_size * g.ring_width;
  for (int l = 0; l < int(s.layers.size()); ++l) {
    const LayerState& L = s.layers[size_t(l)];
    const SnapshotGeometry::Layer& G = g.layers[size_t(l)];
    FS_RETURN_IF_ERROR(check_size("window ring", l, L.ring.size(), ring));
    FS_RETURN_IF_ERROR(check_rows("compressed KV", l, L.ckv, G.ckv, len));
    FS_RETURN_IF_ERROR(check_rows("index keys", l, L.ikeys, G.ikeys, len));
    FS_RETURN_IF_ERROR(check_comp("compressor", l, L.comp, G.comp, len));
    FS_RETURN_IF_ERROR(check_comp("indexer compressor", l, L.icomp, G.icomp, len));
  }
  const int64_t n_eng = int64_t(s.engram_hist.size());
  if (g.engram_keep > 0) {
    // Rollback trims the history by the tokens it drops, so it may be shorter than `keep`, but
    // never shorter than the N−1 ids the next n-grams read.
    if (n_eng > std::min(len, g.engram_keep) || n_eng < std::min(len, g.engram_min))
      return invalid_argument("snapshot: Engram history of {} ids for {} tokens, needs {}..{}",
                              n_eng, len, std::min(len, g.engram_min),
                              std::min(len, g.engram_keep));
    for (int64_t id : s.engram_hist)
      if (id < 0 || id >= g.engram_vocab)
        return invalid_argument("snapshot: Engram id {} outside [0, {})", id, g.engram_vocab);
  } else if (n_eng != 0) {
    return invalid_argument("snapshot: holds an Engram history, this model has no Engram");
  }
  FS_RETURN_IF_ERROR(check_size("MTP ring", -1, s.mtp_ring.size(), g.mtp_row > 0 ? ring : 0));
  if (g.mtp_row > 0) {
    const int64_t n = int64_t(s.mtp_hist_x.size());
    const int64_t rows = n / g.mtp_row;
    // The next chunk reads the newest row whenever the sequence is not empty.
    if (n % g.mtp_row != 0 || rows > std::min<int64_t>(len, 1 + kMaxRollback) ||
        (len > 0 && rows < 1))
      return invalid_argument("snapshot: MTP history of {} values does not fit {} tokens", n, len);
  } else if (!s.mtp_hist_x.empty()) {
    return invalid_argument("snapshot: holds an MTP history, this model has no MTP block");
  }
  if (int64_t(s.draft_rings.size()) != g.draft_stages)
    return invalid_argument("snapshot: {} DSpark rings, this model has {}", s.draft_rings.size(),
                            g.draft_stages);
  for (const auto& d : s.draft_rings) FS_RETURN_IF_ERROR(check_size("DSpark ring", -1, d.size(), ring));
  return {};
}

uint64_t max_snapshot_bytes(const SnapshotGeometry& g) {
  // Mirrors write_state: every vector is a u64 count + its values; a paged-rows object adds a
  // kind byte per sealed page (at most one per row).
  const uint64_t T = uint64_t(std::max<int64_t>(g.max_tokens, 0));
  const uint64_t ring = 8 + 4 * uint64_t(g.ring_size * g.ring_width);
  auto rows = [&](const SnapshotGeometry::Rows& r) {
    const uint64_t n = r.ratio > 0 ? T / uint64_t(r.ratio) : 0;
    return 4 * 8 + n * (4 * uint64_t(r.width) + 1);
  };
  auto comp = [&](const SnapshotGeometry::Compressor& c) {
    const uint64_t r = uint64_t(std::max<int64_t>(c.ratio, 0)), w = uint64_t(c.width);
    return 6 * 8 + 8 + 1 + 8 + 4 * w * (2 * r + 2 * r + 2 * (2 * r + kMaxRollback));
  };
  uint64_t payload = 3 * 8;
  for (const auto& L : g.layers) payload += ring + rows(L.ckv) + rows(L.ikeys) + comp(L.comp) + comp(L.icomp);
  payload += 8 + 8 * uint64_t(g.engram_keep);
  payload += ring + 8 + 4 * uint64_t(g.mtp_row) * (1 + kMaxRollback);
  payload += 8 + uint64_t(g.draft_stages) * ring;
  return kSnapshotHeaderBytes + 4 * T + payload + 8;
}

namespace {

// Bytes of one sequence state: row_bytes(kind, width) gives one row of a window ring (0), a
// compressed KV row (1), an index key row (2) or a DSpark / MTP ring row (3) of `width` values.
template <typename RowBytes>
StateBytes state_bytes(const SnapshotGeometry& g, int64_t tokens, RowBytes row_bytes) {
  const uint64_t T = uint64_t(std::max<int64_t>(tokens, 0));
  auto rows = [&](const SnapshotGeometry::Rows& r) { return r.ratio > 0 ? T / uint64_t(r.ratio) : 0; };
  // An open group and its projection history (v, z), plus the previous window with overlap.
  auto partial = [&](const SnapshotGeometry::Compressor& c) -> uint64_t {
    if (c.ratio <= 0) return 0;
    const uint64_t r = uint64_t(c.ratio), w = uint64_t(c.width);
    return 4 * w * (2 * r + (c.overlap ? 2 * r : 0) + 2 * (2 * r + kMaxRollback));
  };
  StateBytes b;
  const uint64_t ring = uint64_t(g.ring_size) * row_bytes(0, g.ring_width);
  for (const auto& L : g.layers) {
    b.rings += ring;
    b.compressed_kv += rows(L.ckv) * row_bytes(1, L.ckv.width);
    b.index_keys += rows(L.ikeys) * row_bytes(2, L.ikeys.width);
    b.compressors += partial(L.comp) + partial(L.icomp);
  }
  const uint64_t draft_ring = uint64_t(g.ring_size) * row_bytes(3, g.ring_width);
  b.rings += uint64_t(g.draft_stages) * draft_ring;
  if (g.mtp_row > 0) b.rings += draft_ring;
  b.other = 8 * uint64_t(g.engram_keep) + 4 * uint64_t(g.mtp_row) * (1 + kMaxRollback);
  return b;
}

}  // namespace

StateBytes sequence_state_bytes(const SnapshotGeometry& g, int64_t tokens, StateFormat format) {
  const bool fp32 = format == StateFormat::kFp32;
  // Bytes of one row of `w` values: FP32, or the compact code + scale layout of its cache.
  return state_bytes(g, tokens, [&](int kind, int64_t w) -> uint64_t {
    if (fp32) return 4 * uint64_t(w);
    if (kind == 0 || kind == 3) return uint64_t(w + (w + 31) / 32);
    if (kind == 1) return uint64_t((w + 1) / 2 + (w + 15) / 16);
    return uint64_t((w + 1) / 2 + (w + 31) / 32);
  });
}

StateBytes sequence_state_bytes(const SnapshotGeometry& g, int64_t tokens, const CacheFormats& f) {
  return state_bytes(g, tokens, [&](int kind, int64_t w) -> uint64_t {
    if (kind == 3) return 4 * uint64_t(w);  // draft rings stay FP32
    const ops::CacheRowFormat& r = kind == 0 ? f.ring : kind == 1 ? f.ckv : f.ikeys;
    return r.dim == w ? uint64_t(r.row_bytes()) : 4 * uint64_t(w);
  });
}

Result<uint64_t> checkpoint_fingerprint(const std::string& ckpt_dir, const std::string& numerics) {
  namespace fs = std::filesystem;
  if (model::is_memory_checkpoint(ckpt_dir)) {
    // Generated weights (--load-format dummy): the name carries the seed, the config the shapes.
    FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(ckpt_dir, /*validate=*/false));
    const std::string key = ckpt_dir + "\n" + model::config_to_hf_json(ck.config()) + "\n" + numerics;
    return XXH64(key.data(), key.size(), 0x5eedf00d);
  }
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0x5eedf00d);
  auto add_file_part = [&](const fs::path& p, uint64_t off, uint64_t n) -> Status {
    std::ifstream in(p, std::ios::binary);
    if (!in) return io_error("fingerprint: cannot open {}", p.string());
    std::vector<char> buf(static_cast<size_t>(n));
    in.seekg(std::streamoff(off));
    in.read(buf.data(), std::streamsize(n));
    if (in.gcount() != std::streamsize(n)) return io_error("fingerprint: short read of {}", p.string());
    XXH64_update(st, buf.data(), buf.size());
    return {};
  };
  Status status;
  std::error_code ec;
  const fs::path cfg = fs::path(ckpt_dir) / "config.json";
  const uint64_t cfg_size = fs::file_size(cfg, ec);
  if (ec) status = not_found("fingerprint: {} is missing", cfg.string());
  if (status.ok()) status = add_file_part(cfg, 0, cfg_size);
  XXH64_update(st, numerics.data(), numerics.size());
  std::vector<fs::path> shards;
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec))
    if (e.path().extension() == ".safetensors") shards.push_back(e.path());
  std::sort(shards.begin(), shards.end());
  for (const auto& p : shards) {
    if (!status.ok()) break;
    const uint64_t size = fs::file_size(p, ec);
    const std::string name = p.filename().string();
    XXH64_update(st, name.data(), name.size());
    XXH64_update(st, &size, sizeof(size));
    const uint64_t n = std::min<uint64_t>(size, 1 << 20);
    status = add_file_part(p, 0, n);
    if (status.ok() && size > n) status = add_file_part(p, size - n, n);
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  if (!status.ok()) return status;
  return h;
}

}  // namespace flashseek::forward
