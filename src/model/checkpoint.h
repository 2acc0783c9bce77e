// A checkpoint directory in the release format: config.json (or inference/config.json) plus
// safetensors shards (model.safetensors.index.json). Zero-copy tensor views over mmap and
// dequantisation to float32 of every stored format. Validation against the weight map
// (weights.h) reports errors naming the tensor and the file, and unexpected tensors as warnings.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace flashseek::model {

struct TensorView {
  std::string_view name;
  DType dtype = DType::kF32;
  Shape shape;                     // as stored (packed FP4: [out, in/2])
  std::span<const uint8_t> data;   // raw bytes, valid while the Checkpoint lives
  std::string_view file;           // shard path
};

struct ValidationReport {
  std::vector<std::string> errors;    // missing / mis-shaped / wrong-dtype tensors (name + file)
  std::vector<std::string> warnings;  // unexpected tensors, absent optional tensors, absent draft
  // The config declares draft layers (V4 MTP / V4.1 DSpark, `mtp.*`) but the checkpoint ships
  // none of their tensors: the backbone loads without a draft (one warning). A draft that is
  // only partly present is an error naming each missing tensor.
  bool draft_absent = false;
  bool ok() const { return errors.empty(); }
};

class Checkpoint {
 public:
  // Loads the config and every shard header. With `validate`, a failing validate() is an error
  // listing the first problems; warnings stay available through validation().
  // `dir` may also name an in-memory checkpoint registered with register_memory_checkpoint
  // (--load-format dummy): the result then shares that checkpoint's bytes.
  static Result<Checkpoint> open(const std::string& dir, bool validate = true);
  // A checkpoint over shards already in memory; `label` stands in for the directory.
  static Result<Checkpoint> from_shards(const std::string& label, ModelConfig cfg, ShardedSafetensors shards,
                                        bool validate = true);

  const ModelConfig& config() const { return cfg_; }
  const std::string& dir() const { return dir_; }
  const ShardedSafetensors& shards() const { return shards_; }
  const ValidationReport& validation() const { return report_; }

  bool has(std::string_view name) const { return shards_.find(name).file != nullptr; }
  // Not found -> kNotFound naming the tensor and the directory.
  Result<TensorView> find(std::string_view name) const;

  // Logical (dequantised) shape: packed FP4 [out, in/2] with a scale -> [out, in].
  Result<Shape> logical_shape(std::string_view name) const;
  // Whole tensor as float32, row-major in the logical shape. Handles FP8 + `.scale` blocks
  // (block from the config, or [1, 32] Engram rows), FP4 in I8/U8 + `.scale`, BF16/F16/F32/ints.
  Result<std::vector<float>> dequant_f32(std::string_view name) const;
  // Rows [row_begin, row_end) of the logical 2-D view [shape[0], numel/shape[0]] into `out`
  // (size (row_end-row_begin) * cols): embedding and Engram row gathers.
  Status dequant_rows(std::string_view name, int64_t row_begin, int64_t row_end, std::span<float> out) const;
  // Rows ids[i] of the same view into out[i·cols, (i + 1)·cols) (the same values dequant_rows
  // gives each): one tensor lookup for the list, every id checked before any is read, the rows
  // spread over the global thread pool when there are many (a step's Engram gather).
  Status dequant_row_list(std::string_view name, std::span<const int64_t> ids, std::span<float> out) const;
  // Integer tensors (tid2eid: I64 or I32) widened to int64.
  Result<std::vector<int64_t>> read_ints(std::string_view name) const;

  // Re-runs validation against expected_weights(config()).
  ValidationReport validate() const;

  // Small side files an in-memory checkpoint carries instead of a directory's (e.g.
  // engram_token_map.json), by file name; nullptr when absent.
  const std::string* side_file(const std::string& name) const {
    auto it = side_files_.find(name);
    return it == side_files_.end() ? nullptr : &it->second;
  }
  void set_side_file(const std::string& name, std::string text) { side_files_[name] = std::move(text); }

 private:
  std::string dir_;
  ModelConfig cfg_;
  ShardedSafetensors shards_;
  ValidationReport report_;
  std::map<std::string, std::string> side_files_;
};

// In-memory checkpoints by name, so that every backend loads one through Checkpoint::open like a
// directory (a name in use is replaced). Registered checkpoints live until unregistered.
void register_memory_checkpoint(const std::string& name, const Checkpoint& ck);
void unregister_memory_checkpoint(const std::string& name);
bool is_memory_checkpoint(const std::string& name);

}  // namespace flashseek::model
