// Safetensors files (https://github.com/huggingface/safetensors format): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets: [begin, end)}, __metadata__},
// then the raw data. Reading is zero-copy through mmap; every structural problem is an error that
// names the file (and the tensor where there is one).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace flashseek::model {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;              // outermost first, as stored
  uint64_t offset = 0;      // absolute byte offset of the data in the file
  uint64_t nbytes = 0;      // = numel * dtype_size
};

// Read-only memory map of a whole file (unmapped when the last owner goes away).
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  // Zero-filled anonymous memory of `size` bytes, writable until shared with readers (in-memory
  // checkpoints: --load-format dummy). `label` stands in for the path in messages.
  static Result<std::shared_ptr<MappedFile>> anonymous(const std::string& label, uint64_t size);
  // A new file of `size` bytes (its blocks reserved first, so a full disk is an error here and
  // never a fault while writing), mapped shared and writable.
  static Result<std::shared_ptr<MappedFile>> create(const std::string& path, uint64_t size);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  uint8_t* writable_data() const { return writable_ ? const_cast<uint8_t*>(data_) : nullptr; }
  // Whether the bytes are a read-only map of the file at path() (open), so that they can also be
  // read with pread (the GPU loader's staging), rather than anonymous or freshly created memory.
  bool from_disk() const { return from_disk_; }
  int fd() const { return fd_; }  // the open file of a from_disk map, else -1

 private:
  MappedFile() = default;
  bool writable_ = false;
  bool from_disk_ = false;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header: length within the file, JSON object, known dtypes,
  // non-negative shapes, offsets inside the data area, sizes = numel * dtype size, no overlaps.
  static Result<SafetensorsFile> open(const std::string& path);
  // The same over bytes already mapped (an in-memory safetensors image).
  static Result<SafetensorsFile> parse(std::shared_ptr<MappedFile> map);

  const std::string& path() const { return map_->path(); }
  const MappedFile& map() const { return *map_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;
  std::span<const uint8_t> bytes(const TensorInfo& t) const { return {map_->data() + t.offset, t.nbytes}; }

 private:
  std::shared_ptr<MappedFile> map_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// All safetensors of a checkpoint directory: `model.safetensors.index.json` (weight_map name ->
// shard) when present, else a single `model.safetensors`, else every `*.safetensors` file.
class ShardedSafetensors {
 public:
  static Result<ShardedSafetensors> open_dir(const std::string& dir);
  // Just these files (no index); a name in two files is an error.
  static Result<ShardedSafetensors> open_files(const std::vector<std::string>& paths);
  // Files already opened (in-memory images); a name in two files is an error.
  static Result<ShardedSafetensors> from_files(std::vector<SafetensorsFile> files);

  struct Ref {
    const SafetensorsFile* file = nullptr;
    const TensorInfo* info = nullptr;
  };
  // Not found -> file == nullptr.
  Ref find(std::string_view name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const;  // sorted
  size_t size() const { return index_.size(); }

 private:
  Status add_file(SafetensorsFile file);
  std::vector<SafetensorsFile> files_;
  std::unordered_map<std::string, std::pair<size_t, size_t>> index_;  // name -> (file, tensor)
};

// One tensor of a safetensors file to be written, data stored back to back in entry order.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
};
// The bytes in front of the data: the 8-byte little-endian header length and the JSON header,
// padded with spaces to a multiple of 8. `data_bytes` receives the size of the data area.
std::string safetensors_prefix(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata, uint64_t* data_bytes);

// Builds one safetensors file in memory and writes it (header padded to 8 bytes with spaces).
class SafetensorsWriter {
 public:
  // The byte count must equal numel * dtype_size (else an error naming the tensor).
  Status add(std::string name, DType dtype, Shape shape, std::vector<uint8_t> data);
  Status write(const std::string& path) const;
  uint64_t data_bytes() const { return data_bytes_; }
  size_t count() const { return entries_.size(); }
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_{{"format", "pt"}};
  uint64_t data_bytes_ = 0;
};

// Writes `model.safetensors.index.json` for `weight_map` (tensor name -> shard file name).
Status write_safetensors_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size);

}  // namespace flashseek::model
