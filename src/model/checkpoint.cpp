#include "model/checkpoint.h"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "core/prefault.h"
#include "core/thread_pool.h"
#include "model/quant.h"
#include "model/weights.h"

namespace flashseek::model {
namespace {

bool is_packed_fp4(DType d) { return d == DType::kI8 || d == DType::kU8; }

// How a stored tensor decodes (decided from its dtype and the presence/shape of `.scale`).
struct Decode {
  enum Kind { kPlain, kFp8, kFp4 } kind = kPlain;
  int64_t rows = 1, cols = 1;          // logical 2-D view
  int64_t block_rows = 1, block_cols = 1;
  const uint8_t* scale = nullptr;
};

}  // namespace

static std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
static std::map<std::string, Checkpoint>& registry() {
  static std::map<std::string, Checkpoint> r;
  return r;
}

Result<Checkpoint> Checkpoint::open(const std::string& dir, bool validate) {
  {
    std::lock_guard lock(registry_mu());
    auto it = registry().find(dir);
    if (it != registry().end()) {
      if (validate && !it->second.report_.ok()) return invalid_argument("{}: checkpoint does not match its config", dir);
      return it->second;
    }
  }
  FS_ASSIGN_OR_RETURN(ModelConfig cfg, load_config(dir));
  FS_ASSIGN_OR_RETURN(ShardedSafetensors shards, ShardedSafetensors::open_dir(dir));
  return from_shards(dir, std::move(cfg), std::move(shards), validate);
}

void register_memory_checkpoint(const std::string& name, const Checkpoint& ck) {
  std::lock_guard lock(registry_mu());
  registry().insert_or_assign(name, ck);
}

void unregister_memory_checkpoint(const std::string& name) {
  std::lock_guard lock(registry_mu());
  registry().erase(name);
}

bool is_memory_checkpoint(const std::string& name) {
  std::lock_guard lock(registry_mu());
  return registry().count(name) > 0;
}

Result<Checkpoint> Checkpoint::from_shards(const std::string& dir, ModelConfig cfg, ShardedSafetensors shards,
                                           bool validate) {
  Checkpoint ck;
  ck.dir_ = dir;
  ck.cfg_ = std::move(cfg);
  ck.shards_ = std::move(shards);
  ck.report_ = ck.validate();
  if (validate && !ck.report_.ok()) {
    std::string msg = fmt::format("{}: checkpoint does not match its config ({} problems):", dir,
                                  ck.report_.errors.size());
    for (size_t i = 0; i < ck.report_.errors.size() && i < 8; ++i) msg += "\n  " + ck.report_.errors[i];
    if (ck.report_.errors.size() > 8) msg += "\n  ...";
    return invalid_argument("{}", msg);
  }
  return ck;
}

Result<TensorView> Checkpoint::find(std::string_view name) const {
  auto ref = shards_.find(name);
  if (!ref.file) return not_found("tensor {} not found in checkpoint {}", name, dir_);
  const TensorInfo& t = *ref.info;
  return TensorView{t.name, t.dtype, t.shape, ref.file->bytes(t), ref.file->path()};
}

// Works out the decode recipe of `name`; errors name the tensor, its scale and the file.
static Result<Decode> plan_decode(const Checkpoint& ck, const TensorView& t) {
  Decode d;
  if (!t.shape.empty()) {
    d.rows = t.shape[0];
    d.cols = d.rows ? shape_numel(t.shape) / d.rows : 0;
  } else {
    d.cols = 1;
  }
  const bool fp8 = t.dtype == DType::kF8E4M3, fp4 = is_packed_fp4(t.dtype);
  if (!fp8 && !fp4) return d;
  const std::string sname = scale_name_for(std::string(t.name));
  if (!ck.has(sname)) return d;  // un-scaled e4m3 / int8 values are plain
  FS_ASSIGN_OR_RETURN(TensorView s, ck.find(sname));
  if (t.shape.size() != 2 || s.shape.size() != 2 || s.dtype != DType::kF8E8M0)
    return invalid_argument("tensor {} in {}: scale {} must be 2-D F8_E8M0 next to a 2-D weight, got {} {} / {}",
                            t.name, t.file, sname, dtype_name(s.dtype), shape_to_string(s.shape),
                            shape_to_string(t.shape));
  const int64_t sr = s.shape[0], sc = s.shape[1];
  d.scale = s.data.data();
  if (fp4) {
    d.kind = Decode::kFp4;
    d.cols = 2 * t.shape[1];
    if (sr != d.rows || sc * 32 != d.cols)
      return invalid_argument("tensor {} in {}: FP4 scale {} is {}, expected [{}, {}]", t.name, t.file, sname,
                              shape_to_string(s.shape), d.rows, d.cols / 32);
    return d;
  }
  d.kind = Decode::kFp8;
  const int64_t b = ck.config().weight_block_size;
  if (sr == ceil_div(d.rows, b) && sc == ceil_div(d.cols, b)) {
    d.block_rows = d.block_cols = b;
  } else if (sr == d.rows && sc == ceil_div(d.cols, 32)) {
    d.block_rows = 1;  // Engram rows: one scale per 32 values of a row
    d.block_cols = 32;
  } else {
    return invalid_argument("tensor {} in {}: scale {} is {}, expected [{}, {}] ({}x{} blocks) or [{}, {}] "
                            "(per-row 32-groups)", t.name, t.file, sname, shape_to_string(s.shape),
                            ceil_div(d.rows, b), ceil_div(d.cols, b), b, b, d.rows, ceil_div(d.cols, 32));
  }
  return d;
}

Result<Shape> Checkpoint::logical_shape(std::string_view name) const {
  FS_ASSIGN_OR_RETURN(TensorView t, find(name));
  FS_ASSIGN_OR_RETURN(Decode d, plan_decode(*this, t));
  if (d.kind == Decode::kFp4) return Shape{d.rows, d.cols};
  return t.shape;
}

namespace {
// Rows [r0, r1) of a planned tensor into out (checked by the caller).
Status decode_rows(const TensorView& t, const Decode& d, int64_t r0, int64_t r1, float* out) {
  switch (d.kind) {
    case Decode::kFp8:
      dequant_fp8_blocks(t.data.data(), d.scale, d.rows, d.cols, d.block_rows, d.block_cols, r0, r1, out);
      return {};
    case Decode::kFp4:
      dequant_fp4(t.data.data(), d.scale, d.rows, d.cols, r0, r1, out);
      return {};
    case Decode::kPlain: {
      const size_t es = dtype_size(t.dtype);
      const size_t b0 = size_t(r0 * d.cols) * es, b1 = size_t(r1 * d.cols) * es;
      return convert_to_f32(t.dtype, t.data.subspan(b0, b1 - b0), std::span<float>(out, size_t((r1 - r0) * d.cols)));
    }
  }
  return {};
}
}  // namespace

Status Checkpoint::dequant_rows(std::string_view name, int64_t row_begin, int64_t row_end,
                                std::span<float> out) const {
  FS_ASSIGN_OR_RETURN(TensorView t, find(name));
  FS_ASSIGN_OR_RETURN(Decode d, plan_decode(*this, t));
  if (row_begin < 0 || row_begin > row_end || row_end > d.rows)
    return out_of_range("tensor {}: rows [{}, {}) outside [0, {})", name, row_begin, row_end, d.rows);
  if (int64_t(out.size()) != (row_end - row_begin) * d.cols)
    return invalid_argument("tensor {}: output holds {} floats, rows [{}, {}) need {}", name, out.size(),
                            row_begin, row_end, (row_end - row_begin) * d.cols);
  return decode_rows(t, d, row_begin, row_end, out.data());
}

Status Checkpoint::dequant_row_list(std::string_view name, std::span<const int64_t> ids, std::span<float> out) const {
  FS_ASSIGN_OR_RETURN(TensorView t, find(name));
  FS_ASSIGN_OR_RETURN(Decode d, plan_decode(*this, t));
  const int64_t n = int64_t(ids.size());
  if (int64_t(out.size()) != n * d.cols)
    return invalid_argument("tensor {}: output holds {} floats, {} rows need {}", name, out.size(), n, n * d.cols);
  for (const int64_t id : ids)
    if (id < 0 || id >= d.rows) return out_of_range("tensor {}: row {} outside [0, {})", name, id, d.rows);
  std::atomic<bool> bad{false};  // a plain-dtype conversion error (none for a validated tensor)
  auto rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = ids[size_t(i)];
      if (!decode_rows(t, d, r, r + 1, out.data() + i * d.cols).ok()) bad = true;
    }
  };
  constexpr int64_t kRowsPerTask = 32;  // rows of a few hundred values: spread only long lists
  if (n > kRowsPerTask) ThreadPool::global().parallel_for(n, rows, kRowsPerTask);
  else rows(0, n);
  if (bad) return invalid_argument("tensor {}: rows could not be converted from {}", name, dtype_name(t.dtype));
  return {};
}

Result<std::vector<float>> Checkpoint::dequant_f32(std::string_view name) const {
  FS_ASSIGN_OR_RETURN(TensorView t, find(name));
  FS_ASSIGN_OR_RETURN(Decode d, plan_decode(*this, t));
  std::vector<float> out;
  out.reserve(static_cast<size_t>(d.rows * d.cols));  // big: mapped, not yet touched
  prefault_for_write(out.data(), uint64_t(d.rows * d.cols) * 4);
  out.resize(static_cast<size_t>(d.rows * d.cols));
  FS_RETURN_IF_ERROR(dequant_rows(name, 0, d.rows, out));
  return out;
}

Result<std::vector<int64_t>> Checkpoint::read_ints(std::string_view name) const {
  FS_ASSIGN_OR_RETURN(TensorView t, find(name));
  const int64_t n = shape_numel(t.shape);
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (t.dtype == DType::kI64) {
    std::memcpy(out.data(), t.data.data(), size_t(n) * 8);
  } else if (t.dtype == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, t.data.data() + 4 * i, 4);
      out[size_t(i)] = v;
    }
  } else {
    return invalid_argument("tensor {} in {}: dtype {}, expected I64 or I32", name, t.file, dtype_name(t.dtype));
  }
  return out;
}

}  // namespace flashseek::model
