// A safetensors image (model/safetensors.h) as a hostile checkpoint shard would hold it. What
// parses must describe tensors that lie inside the data area, one after another without overlap,
// each nbytes = numel x dtype size, every name found by find().
#include <algorithm>
#include <cstring>

#include "fuzz/targets.h"
#include "model/safetensors.h"

namespace flashseek::fuzz {

bool run_safetensors(std::span<const uint8_t> d) {
  auto map = model::MappedFile::anonymous("fuzz.safetensors", d.size());
  if (!map.ok()) return false;  // (an empty image)
  if (!d.empty()) std::memcpy((*map)->writable_data(), d.data(), d.size());
  auto f = model::SafetensorsFile::parse(*map);
  if (!f.ok()) return false;

  uint64_t header_len = 0;
  FUZZ_CHECK(d.size() >= 8, "parsed an image shorter than its length field");
  std::memcpy(&header_len, d.data(), 8);
  const uint64_t data_start = 8 + header_len;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& t : f->tensors()) {
    FUZZ_CHECK(t.offset >= data_start && t.offset <= d.size() && t.nbytes <= d.size() - t.offset,
               "tensor " + t.name + " lies outside the data area");
    for (int64_t dim : t.shape) FUZZ_CHECK(dim >= 0, "negative dimension in " + t.name);
    FUZZ_CHECK(uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype) == t.nbytes,
               "nbytes of " + t.name + " is not numel x dtype size");
    FUZZ_CHECK(f->find(t.name) == &t, "find() does not return tensor " + t.name);
    FUZZ_CHECK(f->bytes(t).size() == t.nbytes, "bytes() span size");
    if (t.nbytes > 0) spans.emplace_back(t.offset, t.offset + t.nbytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    FUZZ_CHECK(spans[i].first >= spans[i - 1].second, "two tensors overlap");
  return true;
}

std::vector<Bytes> seeds_safetensors() {
  std::vector<Bytes> out;
  const std::vector<std::vector<model::SafetensorsEntry>> sets = {
      {},
      {{"w", DType::kF32, {2, 3}}},
      {{"layers.0.attn.wq.weight", DType::kF8E4M3, {64, 32}},
       {"layers.0.attn.wq.scale", DType::kF8E8M0, {1, 1}},
       {"layers.0.ffn.experts.0.w1.weight", DType::kI8, {16, 8}},
       {"norm.weight", DType::kBF16, {32}},
       {"empty", DType::kF16, {0, 5}},
       {"scalar", DType::kI64, {}}},
  };
  for (size_t i = 0; i < sets.size(); ++i) {
    uint64_t data_bytes = 0;
    std::map<std::string, std::string> meta{{"format", "pt"}};
    if (i == 2) meta["note"] = "seed";
    const std::string prefix = model::safetensors_prefix(sets[i], meta, &data_bytes);
    Bytes b = to_bytes(prefix);
    for (uint64_t k = 0; k < data_bytes; ++k) b.push_back(uint8_t(k * 37));
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace flashseek::fuzz
