#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/json_limits.h"
#include "model/json_fields.h"

namespace flashseek::model {
namespace {

using nlohmann::json;

// Bounds on a checkpoint's JSON before a tree is built (a checkpoint is input like any other).
// The header length matches the safetensors reference implementation's 100 MB limit; a real
// header nests three levels ({name: {"shape": [..]}}) and holds about ten values a tensor.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxIndexBytes = 100ull << 20;  // model.safetensors.index.json
constexpr JsonLimits kCheckpointJsonLimits{/*max_depth=*/8, /*max_values=*/size_t(1) << 23};
constexpr size_t kMaxRank = 8;  // dimensions of one tensor's shape

// Parses one header entry; `data_size` is the size of the data area after the header.
Result<TensorInfo> parse_entry(const std::string& path, const std::string& name, const json& e,
                               uint64_t data_start, uint64_t data_size) {
  if (!e.is_object()) return parse_error("{}: tensor {}: header entry is not an object", path, name);
  auto dt_it = e.find("dtype");
  if (dt_it == e.end() || !dt_it->is_string())
    return parse_error("{}: tensor {}: missing string \"dtype\"", path, name);
  auto dt = dtype_from_name(dt_it->get<std::string>());
  if (!dt) return parse_error("{}: tensor {}: unknown dtype \"{}\"", path, name, dt_it->get<std::string>());
  TensorInfo t;
  t.name = name;
  t.dtype = *dt;
  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array())
    return parse_error("{}: tensor {}: missing array \"shape\"", path, name);
  if (sh->size() > kMaxRank)
    return parse_error("{}: tensor {}: shape has {} dimensions, at most {} are supported", path, name,
                       sh->size(), kMaxRank);
  // numel * dtype size with overflow checks: the product of valid dimensions can exceed 64 bits.
  // Zero dimensions are left out of the product, so that an empty tensor cannot carry other
  // dimensions whose product would overflow code that multiplies a subset of them.
  uint64_t want = dtype_size(t.dtype);
  bool overflow = false, empty = false;
  for (const auto& d : *sh) {
    // Non-negative integers only; unsigned values above INT64_MAX do not fit a Shape entry.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      return parse_error("{}: tensor {}: bad shape {} (dimensions must be integers in [0, 2^63))",
                         path, name, sh->dump());
    const uint64_t dim = d.get<uint64_t>();
    t.shape.push_back(int64_t(dim));
    if (dim == 0) empty = true;
    else overflow = overflow || __builtin_mul_overflow(want, dim, &want);
  }
  if (overflow)
    return out_of_range("{}: tensor {}: dtype {} x shape {} needs more than 2^64 bytes", path, name,
                        dtype_name(t.dtype), shape_to_string(t.shape));
  if (empty) want = 0;
  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    return parse_error("{}: tensor {}: \"data_offsets\" must be two non-negative integers", path, name);
  const uint64_t b = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
  if (b > end || end > data_size)
    return out_of_range("{}: tensor {}: data_offsets [{}, {}) outside the data area of {} bytes "
                        "(file truncated?)", path, name, b, end, data_size);
  if (want != end - b)
    return parse_error("{}: tensor {}: {} bytes stored but dtype {} x shape {} needs {}", path, name,
                       end - b, dtype_name(t.dtype), shape_to_string(t.shape), want);
  t.offset = data_start + b;
  t.nbytes = end - b;
  return t;
}

}  // namespace

// ---- MappedFile --------------------------------------------------------------------------------

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("{}: no such file", path);
    return io_error("{}: cannot open: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return io_error("{}: cannot stat: {}", path, std::strerror(err));
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = uint64_t(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return io_error("{}: mmap failed: {}", path, std::strerror(err));
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  m->fd_ = fd;  // kept open: pread of the same file as the map (from_disk)
  m->from_disk_ = true;
  return m;
}

Result<std::shared_ptr<MappedFile>> MappedFile::anonymous(const std::string& label, uint64_t size) {
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = label;
  m->size_ = size;
  m->writable_ = true;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return io_error("{}: cannot map {} bytes of memory: {}", label, size, std::strerror(errno));
    m->data_ = static_cast<const uint8_t*>(p);
  }
  return m;
}

Result<std::shared_ptr<MappedFile>> MappedFile::create(const std::string& path, uint64_t size) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("{}: cannot create: {}", path, std::strerror(errno));
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = size;
  m->writable_ = true;
  if (size > 0) {
    if (const int err = ::posix_fallocate(fd, 0, off_t(size)); err != 0) {
      ::close(fd);
      return io_error("{}: cannot reserve {} bytes: {}", path, size, std::strerror(err));
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return io_error("{}: mmap failed: {}", path, std::strerror(err));
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  FS_ASSIGN_OR_RETURN(auto map, MappedFile::open(path));
  return parse(std::move(map));
}

Result<SafetensorsFile> SafetensorsFile::parse(std::shared_ptr<MappedFile> map) {
  if (!map) return invalid_argument("safetensors: no data");
  const std::string& path = map->path();
  if (map->size() < 8)
    return parse_error("{}: truncated: {} bytes, not even the 8-byte header length", path, map->size());
  uint64_t hlen = 0;
  std::memcpy(&hlen, map->data(), 8);  // little-endian host (x86-64 / aarch64)
  if (hlen > map->size() - 8)
    return out_of_range("{}: header length {} goes beyond the file size {} (truncated?)", path, hlen,
                        map->size());
  if (hlen > kMaxHeaderBytes)
    return out_of_range("{}: header length {} is above the limit of {} bytes", path, hlen, kMaxHeaderBytes);
  const char* hbeg = reinterpret_cast<const char*>(map->data() + 8);
  if (JsonScan scan = scan_json({hbeg, size_t(hlen)}, kCheckpointJsonLimits); scan != JsonScan::kOk)
    return parse_error("{}: header is {}", path, describe(scan, kCheckpointJsonLimits));
  json header = json::parse(hbeg, hbeg + hlen, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    return parse_error("{}: header is not a valid JSON object", path);
  SafetensorsFile f;
  const uint64_t data_start = 8 + hlen, data_size = map->size() - data_start;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return parse_error("{}: __metadata__ is not an object", path);
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return parse_error("{}: __metadata__.{} is not a string", path, m.key());
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    FS_ASSIGN_OR_RETURN(TensorInfo t, parse_entry(path, it.key(), *it, data_start, data_size));
    f.tensors_.push_back(std::move(t));
  }
  // Overlap check on the sorted byte ranges (empty tensors cannot overlap anything).
  std::vector<const TensorInfo*> order;
  for (const auto& t : f.tensors_) if (t.nbytes > 0) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
      return parse_error("{}: tensors {} and {} overlap", path, order[i - 1]->name, order[i]->name);
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.by_name_[f.tensors_[i].name] = i;
  f.map_ = std::move(map);
  return f;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

// ---- ShardedSafetensors ------------------------------------------------------------------------

Status ShardedSafetensors::add_file(SafetensorsFile file) {
  const size_t fi = files_.size();
  for (size_t ti = 0; ti < file.tensors().size(); ++ti) {
    const std::string& name = file.tensors()[ti].name;
    auto [it, fresh] = index_.emplace(name, std::make_pair(fi, ti));
    if (!fresh)
      return invalid_argument("tensor {} is stored twice: in {} and in {}", name,
                              files_[it->second.first].path(), file.path());
  }
  files_.push_back(std::move(file));
  return {};
}

Result<ShardedSafetensors> ShardedSafetensors::open_files(const std::vector<std::string>& paths) {
  ShardedSafetensors s;
  for (const auto& p : paths) {
    FS_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(p));
    FS_RETURN_IF_ERROR(s.add_file(std::move(f)));
  }
  return s;
}

Result<ShardedSafetensors> ShardedSafetensors::from_files(std::vector<SafetensorsFile> files) {
  ShardedSafetensors s;
  for (auto& f : files) FS_RETURN_IF_ERROR(s.add_file(std::move(f)));
  return s;
}

Result<ShardedSafetensors> ShardedSafetensors::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    if (fs::exists(fs::path(dir) / "model.safetensors"))
      return open_files({(fs::path(dir) / "model.safetensors").string()});
    std::vector<std::string> all;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") all.push_back(e.path().string());
    if (ec) return io_error("{}: cannot list directory: {}", dir, ec.message());
    if (all.empty()) return not_found("{}: no model.safetensors.index.json and no *.safetensors file", dir);
    std::sort(all.begin(), all.end());
    return open_files(all);
  }
  const std::string ip = index_path.string();
  FS_ASSIGN_OR_RETURN(std::string text, read_bounded_file(ip, kMaxIndexBytes));
  if (JsonScan scan = scan_json(text, kCheckpointJsonLimits); scan != JsonScan::kOk)
    return parse_error("{}: {}", ip, describe(scan, kCheckpointJsonLimits));
  json idx = json::parse(text, nullptr, false);
  if (idx.is_discarded() || !idx.is_object()) return parse_error("{}: not valid JSON", ip);
  auto wm = idx.find("weight_map");
  if (wm == idx.end() || !wm->is_object()) return parse_error("{}: missing object \"weight_map\"", ip);
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string()) return parse_error("{}: weight_map.{} is not a file name", ip, it.key());
    by_shard[it->get<std::string>()].push_back(it.key());
  }
  ShardedSafetensors s;
  for (const auto& [shard, names] : by_shard) {
    const std::string path = (fs::path(dir) / shard).string();
    auto f = SafetensorsFile::open(path);
    if (!f.ok()) return f.status().with_context(fmt::format("{} lists shard {}", ip, shard));
    for (const auto& n : names)
      if (!f->find(n)) return not_found("{}: tensor {} is listed for {} but that shard does not contain it", ip, n, path);
    FS_RETURN_IF_ERROR(s.add_file(std::move(f).value()));
  }
  // A tensor in a shard but not in the index would be invisible to index-driven loaders.
  for (const auto& f : s.files_)
    for (const auto& t : f.tensors())
      if (!wm->contains(t.name))
        return invalid_argument("{}: tensor {} is stored in {} but missing from the weight_map", ip, t.name, f.path());
  return s;
}

ShardedSafetensors::Ref ShardedSafetensors::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) return {};
  const auto& f = files_[it->second.first];
  return {&f, &f.tensors()[it->second.second]};
}

std::vector<std::string> ShardedSafetensors::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [n, _] : index_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

// ---- writer ------------------------------------------------------------------------------------

Status SafetensorsWriter::add(std::string name, DType dtype, Shape shape, std::vector<uint8_t> data) {
  for (int64_t d : shape)
    if (d < 0) return invalid_argument("tensor {}: negative dimension in {}", name, shape_to_string(shape));
  const uint64_t want = uint64_t(shape_numel(shape)) * dtype_size(dtype);
  if (data.size() != want)
    return invalid_argument("tensor {}: {} bytes given, dtype {} x shape {} needs {}", name, data.size(),
                            dtype_name(dtype), shape_to_string(shape), want);
  data_bytes_ += data.size();
  entries_.push_back({std::move(name), dtype, std::move(shape), std::move(data)});
  return {};
}

std::string safetensors_prefix(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata, uint64_t* data_bytes) {
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& e : entries) {
    const uint64_t n = uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype);
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  const uint64_t hlen = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &hlen, 8);
  if (data_bytes) *data_bytes = off;
  return out + h;
}

Status SafetensorsWriter::write(const std::string& path) const {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(entries_.size());
  for (const auto& e : entries_) entries.push_back({e.name, e.dtype, e.shape});
  const std::string prefix = safetensors_prefix(entries, metadata_, nullptr);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("{}: cannot create", path);
  out.write(prefix.data(), std::streamsize(prefix.size()));
  for (const auto& e : entries_) out.write(reinterpret_cast<const char*>(e.data.data()), std::streamsize(e.data.size()));
  out.close();
  if (!out) return io_error("{}: write failed", path);
  return {};
}

Status write_safetensors_index(const std::string& dir, const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size) {
  json j = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  const std::string path = (std::filesystem::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(path, std::ios::trunc);
  if (!out) return io_error("{}: cannot create", path);
  out << j.dump(1) << "\n";
  if (!out) return io_error("{}: write failed", path);
  return {};
}

}  // namespace flashseek::model
