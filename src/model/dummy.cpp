// --load-format dummy (dummy.h): layer reduction and the in-memory checkpoint.
#include "model/dummy.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/make_tiny.h"
#include "model/safetensors.h"
#include "model/tensor_gen.h"
#include "model/weights.h"

namespace flashseek::model {
namespace {

// The attention kind of a layer (what its compressed KV / top-k path does); hash routing and
// Engram are separate features, each needed once.
std::tuple<int, bool, bool, bool, bool, bool> attention_kind(const ModelConfig& c, int l) {
  const LayerRole& r = c.role(l);
  const bool own_kv = r.kv_src == l, own_idx = r.idx_src == l;
  const bool reads_filtered = r.idx_src >= 0 && !own_idx && c.role(r.idx_src).candidate_filtered;
  return {r.ratio, own_kv, own_idx, r.candidate_source, r.candidate_filtered, reads_filtered};
}

std::vector<int> remap(const std::vector<int>& ids, const std::map<int, int>& to_new) {
  std::vector<int> out;
  for (int id : ids)
    if (auto it = to_new.find(id); it != to_new.end()) out.push_back(it->second);
  return out;
}

}  // namespace

Result<ReducedConfig> reduce_layers(const ModelConfig& cfg, int64_t n) {
  if (n <= 0) return invalid_argument("--num-layers: must be > 0, got {}", n);
  ReducedConfig out;
  out.cfg = cfg;
  const int L = int(cfg.num_layers);
  if (n >= L) {
    for (int l = 0; l < L; ++l) out.kept.push_back(l);
    out.summary = fmt::format("all {} layers kept", L);
    return out;
  }
  // The first layer of every attention kind and of every feature, with the sources it reads.
  std::set<int> keep;
  std::set<std::tuple<int, bool, bool, bool, bool, bool>> kinds;
  bool hash = false, engram = false;
  for (int l = 0; l < L; ++l) {
    const LayerRole& r = cfg.role(l);
    bool want = kinds.insert(attention_kind(cfg, l)).second;
    if (r.hash_routed && !hash) want = hash = true;
    if (r.engram && !engram) want = engram = true;
    if (!want) continue;
    keep.insert(l);
    if (r.kv_src >= 0) keep.insert(r.kv_src);
    if (r.idx_src >= 0) keep.insert(r.idx_src);
  }
  if (int64_t(keep.size()) > n)
    return invalid_argument("--num-layers {}: keeping every layer role of this config needs at least {} layers "
                            "(layers {})", n, keep.size(), fmt::join(keep, ","));
  // Then the earliest other layers (their sources come earlier, so they are kept already).
  for (int l = 0; l < L && int64_t(keep.size()) < n; ++l) keep.insert(l);
  out.kept.assign(keep.begin(), keep.end());
  std::map<int, int> to_new;
  for (size_t i = 0; i < out.kept.size(); ++i) to_new[out.kept[i]] = int(i);

  ModelConfig& c = out.cfg;
  c.num_layers = n;
  std::vector<int> ratios;
  for (int l : out.kept) ratios.push_back(cfg.compress_ratios[size_t(l)]);
  for (int64_t l = cfg.num_layers; l < total_layers(cfg); ++l) ratios.push_back(cfg.compress_ratios[size_t(l)]);
  c.compress_ratios = ratios;
  int hash_layers = 0;
  for (int l : out.kept) hash_layers += l < cfg.num_hash_layers ? 1 : 0;
  c.num_hash_layers = hash_layers;  // a prefix of the kept layers (hash layers are a prefix)
  c.kv_source_layers = remap(cfg.kv_source_layers, to_new);
  c.index_source_layers = remap(cfg.index_source_layers, to_new);
  c.candidate_source_layer = cfg.candidate_source_layer >= 0 && to_new.count(cfg.candidate_source_layer)
                                 ? to_new[cfg.candidate_source_layer]
                                 : -1;
  c.engram_layer_ids.clear();
  c.engram_num_embeddings.clear();
  for (size_t i = 0; i < cfg.engram_layer_ids.size(); ++i)
    if (auto it = to_new.find(cfg.engram_layer_ids[i]); it != to_new.end()) {
      c.engram_layer_ids.push_back(it->second);
      c.engram_num_embeddings.push_back(cfg.engram_num_embeddings[i]);
    }
  std::string taps = "";
  if (!cfg.dspark_target_layer_ids.empty()) {
    c.dspark_target_layer_ids = remap(cfg.dspark_target_layer_ids, to_new);
    if (c.dspark_target_layer_ids.size() != cfg.dspark_target_layer_ids.size()) {
      // The taps are inputs of layers: the last kept ones stand in for dropped targets.
      const int64_t k = std::min<int64_t>(int64_t(cfg.dspark_target_layer_ids.size()), n);
      c.dspark_target_layer_ids.clear();
      for (int64_t i = n - k; i < n; ++i) c.dspark_target_layer_ids.push_back(int(i));
      taps = fmt::format(" (moved to the last {} kept layers)", k);
    }
  }
  FS_RETURN_IF_ERROR(finalize_config(c).with_context(fmt::format("--num-layers {}", n)));
  out.summary = fmt::format("kept layers {} of {} as 0-{}", fmt::join(out.kept, ","), L, n - 1);
  if (c.is_v41())
    out.summary += fmt::format("; kv sources [{}], index sources [{}], candidate source {}, engram [{}], "
                               "dspark targets [{}]{}", fmt::join(c.kv_source_layers, ","),
                               fmt::join(c.index_source_layers, ","), c.candidate_source_layer,
                               fmt::join(c.engram_layer_ids, ","), fmt::join(c.dspark_target_layer_ids, ","), taps);
  else
    out.summary += fmt::format("; ratios [{}], hash-routed layers {}, {} MTP layer(s)",
                               fmt::join(c.compress_ratios, ","), c.num_hash_layers, c.num_mtp_layers);
  return out;
}

Result<Checkpoint> make_dummy_checkpoint(const ModelConfig& cfg_in, const DummyOptions& opt,
                                         const std::string& label) {
  ModelConfig cfg = cfg_in;
  FS_RETURN_IF_ERROR(finalize_config(cfg));
  const std::vector<WeightSpec> specs = expected_weights(cfg);
  std::vector<WeightGen> gens;
  std::vector<WeightPlace> place(specs.size());
  std::vector<SafetensorsEntry> entries;
  uint64_t off = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    gens.push_back(plan_weight(specs[i], cfg));
    for (size_t k = 0; k < gens[i].stored.size(); ++k) {
      const StoredTensor& t = gens[i].stored[k];
      entries.push_back({t.name, t.dtype, t.shape});
      place[i].offsets.push_back(off);
      off += gens[i].bytes[k];
    }
  }
  uint64_t data_bytes = 0;
  const std::string prefix = safetensors_prefix(entries, {{"format", "pt"}}, &data_bytes);
  FS_ASSIGN_OR_RETURN(auto image, MappedFile::anonymous(label, prefix.size() + data_bytes));
  uint8_t* base = image->writable_data();
  std::memcpy(base, prefix.data(), prefix.size());
  for (auto& p : place)
    for (auto& o : p.offsets) o += prefix.size();
  generate_weights(gens, place, {base}, cfg, opt.seed, opt.threads, nullptr);
  FS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::parse(std::move(image)));
  std::vector<SafetensorsFile> files;
  files.push_back(std::move(file));
  FS_ASSIGN_OR_RETURN(ShardedSafetensors shards, ShardedSafetensors::from_files(std::move(files)));
  const bool engram = cfg.is_v41() && !cfg.engram_layer_ids.empty();
  FS_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::from_shards(label, std::move(cfg), std::move(shards)));
  if (engram) ck.set_side_file("engram_token_map.json", synthetic_engram_token_map_json(ck.config()));
  return ck;
}

}  // namespace flashseek::model
