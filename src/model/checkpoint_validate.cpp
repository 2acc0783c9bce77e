// Checkpoint::validate: every expected tensor present with an accepted dtype and shape
// (weights.h kinds), scales consistent, unexpected tensors reported as warnings.
#include <unordered_set>

#include <fmt/format.h>

#include "model/checkpoint.h"
#include "model/weights.h"

namespace flashseek::model {
namespace {

bool is_float(DType d) { return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32; }

class Validator {
 public:
  Validator(const Checkpoint& ck, ValidationReport& r) : ck_(ck), r_(r) {}
  std::unordered_set<std::string> used;

  void check(const WeightSpec& w) {
    auto t = ck_.find(w.name);
    if (!t.ok()) {
      if (w.optional) r_.warnings.push_back(fmt::format("optional tensor {} is absent", w.name));
      else r_.errors.push_back(fmt::format("missing tensor {} (in no shard of {})", w.name, ck_.dir()));
      return;
    }
    used.insert(w.name);
    const TensorView& v = *t;
    const std::string sname = scale_name_for(w.name);
    const bool has_scale = ck_.has(sname);
    if (has_scale) used.insert(sname);
    switch (w.kind) {
      case WeightKind::kPlain: return plain(w, v, has_scale, sname);
      case WeightKind::kLinear: return quantised(w, v, sname, has_scale, false);
      case WeightKind::kExpert: return quantised(w, v, sname, has_scale, true);
      case WeightKind::kEngramTable: return quantised(w, v, sname, has_scale, false, true);
    }
  }

 private:
  void error(const TensorView& v, const std::string& what) {
    r_.errors.push_back(fmt::format("tensor {} in {}: {}", v.name, v.file, what));
  }
  bool expect_shape(const TensorView& v, const Shape& want) {
    if (v.shape == want) return true;
    error(v, fmt::format("shape {}, expected {}", shape_to_string(v.shape), shape_to_string(want)));
    return false;
  }
  void expect_scale(const TensorView& w, const std::string& sname, bool has, const Shape& want) {
    if (!has) return error(w, fmt::format("dtype {} needs its scale tensor {}", dtype_name(w.dtype), sname));
    auto s = ck_.find(sname);
    if (s->dtype != DType::kF8E8M0)
      return error(*s, fmt::format("dtype {}, expected F8_E8M0", dtype_name(s->dtype)));
    expect_shape(*s, want);
  }

  void plain(const WeightSpec& w, const TensorView& v, bool has_scale, const std::string& sname) {
    const bool ok = is_float(w.dtype) ? is_float(v.dtype)
                                      : (v.dtype == DType::kI64 || v.dtype == DType::kI32);
    if (!ok)
      return error(v, fmt::format("dtype {}, expected {}", dtype_name(v.dtype),
                                  is_float(w.dtype) ? "BF16/F16/F32" : "I64/I32"));
    if (has_scale) error(v, fmt::format("unquantised tensor has an unexpected scale {}", sname));
    expect_shape(v, w.shape);
  }

  void quantised(const WeightSpec& w, const TensorView& v, const std::string& sname, bool has_scale,
                 bool expert, bool engram = false) {
    const int64_t out = w.shape[0], in = w.shape[1], b = ck_.config().weight_block_size;
    if (is_float(v.dtype)) {
      if (has_scale) error(v, fmt::format("{} weight has an unexpected scale {}", dtype_name(v.dtype), sname));
      expect_shape(v, w.shape);
    } else if (v.dtype == DType::kF8E4M3) {
      if (!expect_shape(v, w.shape)) return;
      if (engram) expect_scale(v, sname, has_scale, {out, ceil_div(in, 32)});
      else expect_scale(v, sname, has_scale, {ceil_div(out, b), ceil_div(in, b)});
    } else if (expert && (v.dtype == DType::kI8 || v.dtype == DType::kU8)) {
      if (in % 32 != 0) return error(v, fmt::format("FP4 needs an input dim divisible by 32, logical {}", in));
      if (!expect_shape(v, {out, in / 2})) return;
      expect_scale(v, sname, has_scale, {out, in / 32});
    } else {
      error(v, fmt::format("dtype {}, expected {}", dtype_name(v.dtype),
                           expert ? "I8/U8 (FP4) + scale, F8_E4M3 + scale, or BF16/F16/F32"
                                  : "F8_E4M3 + scale or BF16/F16/F32"));
    }
  }

  const Checkpoint& ck_;
  ValidationReport& r_;
};

}  // namespace

ValidationReport Checkpoint::validate() const {
  ValidationReport r;
  Validator v(*this, r);
  const std::vector<WeightSpec> specs = expected_weights(cfg_);
  auto is_draft = [](const WeightSpec& w) {
    return w.component == Component::kDraftDense || w.component == Component::kDraftExperts;
  };
  int64_t draft_total = 0, draft_present = 0;
  for (const WeightSpec& w : specs)
    if (is_draft(w)) ++draft_total, draft_present += has(w.name) ? 1 : 0;
  r.draft_absent = draft_total > 0 && draft_present == 0;
  if (r.draft_absent)
    r.warnings.push_back(fmt::format(
        "the config declares {} draft layer(s) (num_nextn_predict_layers) but the checkpoint ships "
        "none of their {} tensors (mtp.*): loading without a draft, speculative decoding off",
        cfg_.num_mtp_layers, draft_total));
  for (const WeightSpec& w : specs)
    if (!(r.draft_absent && is_draft(w))) v.check(w);
  for (const auto& f : shards_.files())
    for (const auto& t : f.tensors())
      if (!v.used.count(t.name))
        r.warnings.push_back(fmt::format("unexpected tensor {} in {} ({} {})", t.name, f.path(),
                                         dtype_name(t.dtype), shape_to_string(t.shape)));
  return r;
}

}  // namespace flashseek::model
