#include "model/counts.h"

#include <unordered_map>

namespace flashseek::model {
namespace {

void add_tensor(ModelCounts& m, Component c, DType dt, const Shape& shape, int64_t params) {
  CountRow r;
  r.params = params;
  r.bytes = uint64_t(shape_numel(shape)) * dtype_size(dt);
  r.tensors = 1;
  m.components[size_t(c)].add(r);
  m.total.add(r);
  CountRow d = r;
  d.params = shape_numel(shape);  // per-dtype rows count stored elements
  m.dtypes[std::string(dtype_name(dt))].add(d);
}

}  // namespace

ModelCounts count_from_config(const ModelConfig& cfg) {
  ModelCounts m;
  for (const WeightSpec& w : expected_weights(cfg)) {
    const auto stored = release_tensors(w, cfg);
    for (size_t i = 0; i < stored.size(); ++i)
      add_tensor(m, w.component, stored[i].dtype, stored[i].shape, i == 0 ? shape_numel(w.shape) : 0);
  }
  return m;
}

ModelCounts count_from_checkpoint(const Checkpoint& ck) {
  struct Owner {
    Component component;
    bool is_scale;
  };
  std::unordered_map<std::string, Owner> owners;
  for (const WeightSpec& w : expected_weights(ck.config())) {
    owners[w.name] = {w.component, false};
    if (w.kind != WeightKind::kPlain) owners[scale_name_for(w.name)] = {w.component, true};
  }
  ModelCounts m;
  for (const auto& f : ck.shards().files())
    for (const TensorInfo& t : f.tensors()) {
      auto it = owners.find(t.name);
      const Component c = it == owners.end() ? Component::kOther : it->second.component;
      int64_t params = shape_numel(t.shape);
      if (it != owners.end() && it->second.is_scale) {
        params = 0;
      } else if ((t.dtype == DType::kI8 || t.dtype == DType::kU8) && ck.has(scale_name_for(t.name))) {
        params *= 2;  // packed FP4: two values a byte
      }
      add_tensor(m, c, t.dtype, t.shape, params);
    }
  return m;
}

}  // namespace flashseek::model
