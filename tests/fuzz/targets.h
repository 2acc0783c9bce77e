// Fuzz harnesses over the parsers of untrusted input (docs/security.md, Fuzzing). Each harness
// takes any bytes and must return normally: a refusal is a Status, never a crash, an escaping
// exception, a sanitizer report or a stall. What a harness accepts it checks against a property
// of the format (a decoded snapshot re-encodes and decodes to the same bytes, a parsed config
// writes out and parses back to the same text, the streaming output parser agrees with the
// one-shot one, ...); a broken property aborts through FUZZ_CHECK.
//
// The same harnesses run in two drivers: libFuzzer binaries (fuzz_<name>, -DFLASHSEEK_FUZZ=ON with
// clang; scripts/fuzz.sh) and the ctest replay (test_fuzz), which feeds every seed, every file of
// tests/fuzz/corpus/<name>/ (inputs a campaign found) and seeded random mutations of the seeds.
#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flashseek::tok {
class Tokenizer;
}
namespace flashseek::forward {
struct SnapshotGeometry;
}

namespace flashseek::fuzz {

using Bytes = std::vector<uint8_t>;

struct Target {
  const char* name;
  // True when the parser accepted the input (and its properties were checked).
  bool (*run)(std::span<const uint8_t> data);
  // Valid inputs for the mutations to start from (built in code: no binary files in the tree).
  std::vector<Bytes> (*seeds)();
  bool needs_tokenizer = false;  // loads the V4.1 tokenizer (models/tokenizer, scripts/setup.sh)
};

std::span<const Target> targets();
const Target* find_target(std::string_view name);

// Prints what broke and where, then aborts (libFuzzer keeps the input; ctest sees the crash).
[[noreturn]] void fail(const char* file, int line, const std::string& what);
#define FUZZ_CHECK(cond, what)                                         \
  do {                                                                 \
    if (!(cond)) ::flashseek::fuzz::fail(__FILE__, __LINE__, (what));  \
  } while (0)

inline Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
// A little-endian u64 at `at` (the caller checks the bounds), and the offsets of the snapshot
// header's fields (forward/state_io.h: magic, version, reserved, then these).
inline uint64_t load_u64(std::span<const uint8_t> b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
inline constexpr size_t kSnapFingerprintAt = 16, kSnapTenantAt = 24, kSnapKeyAt = 32, kSnapTokensAt = 40;

// A mode byte followed by text.
inline Bytes with_mode(uint8_t mode, std::string_view s) {
  Bytes b{mode};
  b.insert(b.end(), s.begin(), s.end());
  return b;
}
inline std::string_view as_text(std::span<const uint8_t> d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// A tiny checkpoint of a built-in config ("tiny-v41", "tiny-v4") written once per process into a
// temporary directory (removed at exit): what the snapshot harness decodes against.
const std::string& tiny_checkpoint(const std::string& config_name);
// The snapshot geometry of tiny-v4's (v4) or tiny-v41's checkpoint, for states of up to
// kTinyMaxTokens tokens.
inline constexpr int64_t kTinyMaxTokens = 4096;
const forward::SnapshotGeometry& tiny_geometry(bool v4);

// The V4.1 tokenizer (models/tokenizer), loaded once.
const tok::Tokenizer& v41_tokenizer();

// The harnesses (one file each under targets/).
bool run_snapshot(std::span<const uint8_t> d);
std::vector<Bytes> seeds_snapshot();
bool run_state_cache(std::span<const uint8_t> d);
std::vector<Bytes> seeds_state_cache();
bool run_safetensors(std::span<const uint8_t> d);
std::vector<Bytes> seeds_safetensors();
bool run_config(std::span<const uint8_t> d);
std::vector<Bytes> seeds_config();
bool run_request(std::span<const uint8_t> d);
std::vector<Bytes> seeds_request();
bool run_completion(std::span<const uint8_t> d);
std::vector<Bytes> seeds_completion();
bool run_tokenizer(std::span<const uint8_t> d);
std::vector<Bytes> seeds_tokenizer();
bool run_api_keys(std::span<const uint8_t> d);
std::vector<Bytes> seeds_api_keys();
bool run_redis_url(std::span<const uint8_t> d);
std::vector<Bytes> seeds_redis_url();

}  // namespace flashseek::fuzz
