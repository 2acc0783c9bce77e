#include "tokenizer/bpe.h"

#include <array>
#include <mutex>
#include <queue>

#include "tokenizer/tokenizer_utf8.h"

namespace flashseek::tok {
namespace {

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte has a visible, non-whitespace stand-in.
struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<char32_t, uint8_t> from_unicode;
  ByteTables() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : next++;
      to_unicode[b] = utf8_encode(cp);
      from_unicode[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Decodes one code point of valid UTF-8 (precondition checked by the caller).
char32_t decode_cp(std::string_view s, size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  if (len == 1) return p[0];
  char32_t cp = p[0] & (0x7F >> len);
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  return cp;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) { return byte_tables().to_unicode[byte]; }

std::optional<std::string> unicode_to_bytes(std::string_view token) {
  const auto& table = byte_tables().from_unicode;
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const Utf8Step step = utf8_step(token.substr(i));
    if (step.kind != Utf8Kind::kValid) return std::nullopt;
    auto it = table.find(decode_cp(token.substr(i), step.length));
    if (it == table.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += step.length;
  }
  return out;
}

// Sharded map piece -> ids. Sharding keeps lock contention low when several server threads
// encode at once; a full shard is simply cleared (the working set of words is small).
class WordCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxEntriesPerShard = 8192;
  static constexpr size_t kMaxPieceBytes = 256;  // longer pieces are rare; don't cache them

  bool lookup(std::string_view piece, std::vector<int32_t>& out) const {
    const size_t h = std::hash<std::string_view>{}(piece);
    const Shard& shard = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(piece);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void insert(std::string_view piece, const int32_t* ids, size_t n) {
    if (piece.size() > kMaxPieceBytes) return;
    const size_t h = std::hash<std::string_view>{}(piece);
    Shard& shard = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= kMaxEntriesPerShard) shard.map.clear();
    shard.map.emplace(std::string(piece), std::vector<int32_t>(ids, ids + n));
  }
  size_t size() const {
    size_t n = 0;
    for (const auto& s : shards_) {
      std::lock_guard<std::mutex> lock(s.mu);
      n += s.map.size();
    }
    return n;
  }
  void clear() {
    for (auto& s : shards_) {
      std::lock_guard<std::mutex> lock(s.mu);
      s.map.clear();
    }
  }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  std::array<Shard, kShards> shards_;
};

BpeModel::BpeModel() : cache_(std::make_unique<WordCache>()) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

Result<BpeModel> BpeModel::create(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                  const std::vector<std::pair<std::string, std::string>>& merges) {
  BpeModel m;
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) return parse_error("BPE vocab: token '{}' has negative id {}", token, id);
    max_id = std::max(max_id, id);
  }
  m.tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
  m.bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  m.present_.assign(static_cast<size_t>(max_id + 1), 0);
  m.token_ids_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    if (m.present_[id]) return parse_error("BPE vocab: id {} is used twice", id);
    if (!m.token_ids_.emplace(token, id).second) {
      return parse_error("BPE vocab: token '{}' is listed twice", token);
    }
    m.present_[id] = 1;
    m.tokens_[id] = token;
    // Tokens outside the ByteLevel alphabet (e.g. "<｜begin▁of▁sentence｜>" stored in the
    // V3 vocab) decode to their own text, as HF's ByteLevel decoder does.
    m.bytes_[id] = unicode_to_bytes(token).value_or(token);
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t id = m.token_to_id(byte_to_unicode(static_cast<uint8_t>(b)));
    if (id < 0) return parse_error("BPE vocab: no token for byte 0x{:02X}", b);
    m.byte_ids_[b] = id;
  }
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t l = m.token_to_id(left), r = m.token_to_id(right);
    const int32_t merged = m.token_to_id(left + right);
    if (l < 0 || r < 0 || merged < 0) {
      return parse_error("BPE merges[{}] '{} {}': part or result not in the vocab", rank, left,
                         right);
    }
    // A duplicate pair keeps its first (lowest) rank, as HF does.
    m.merges_.emplace(pair_key(l, r), MergeTarget{static_cast<int32_t>(rank), merged});
  }
  return m;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = token_ids_.find(token);
  return it == token_ids_.end() ? -1 : it->second;
}

std::optional<std::string_view> BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit() || !present_[id]) return std::nullopt;
  return std::string_view(tokens_[id]);
}

std::optional<std::string_view> BpeModel::id_to_bytes(int32_t id) const {
  if (id < 0 || id >= id_limit() || !present_[id]) return std::nullopt;
  return std::string_view(bytes_[id]);
}

size_t BpeModel::cache_size() const { return cache_->size(); }
void BpeModel::clear_cache() const { cache_->clear(); }

// Merges `ids` in place: always the lowest-rank adjacent pair, leftmost on ties. A heap of
// candidate pairs over a doubly linked list of symbols keeps long pieces (CJK runs, whitespace
// runs) at O(n log n); stale heap entries are detected by re-checking the pair.
void BpeModel::merge_symbols(std::vector<int32_t>& ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(ids[pos], ids[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push_pair(i);
  std::vector<uint8_t> dead(n, 0);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (dead[c.pos] || next[c.pos] < 0) continue;
    const int right = next[c.pos];
    auto it = merges_.find(pair_key(ids[c.pos], ids[right]));
    if (it == merges_.end() || it->second.new_id != c.new_id) continue;  // stale
    ids[c.pos] = c.new_id;
    dead[right] = 1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push_pair(prev[c.pos]);
    push_pair(c.pos);
  }
  int out = 0;
  for (int i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (cache_->lookup(piece, out)) return;
  std::vector<int32_t> ids(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  merge_symbols(ids);
  cache_->insert(piece, ids.data(), ids.size());
  out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace flashseek::tok
