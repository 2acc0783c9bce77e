// Minimal .npy reader for the oracle fixtures (little-endian f4 / i8, C order, any rank).
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::testing {

struct Npy {
  std::string descr;            // "<f4", "<i8", ...
  std::vector<int64_t> shape;
  std::vector<char> data;       // raw element bytes
  int64_t numel() const {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
  std::vector<float> f32() const {
    std::vector<float> v(static_cast<size_t>(numel()));
    std::memcpy(v.data(), data.data(), v.size() * 4);
    return v;
  }
  std::vector<int64_t> i64() const {
    std::vector<int64_t> v(static_cast<size_t>(numel()));
    std::memcpy(v.data(), data.data(), v.size() * 8);
    return v;
  }
};

inline Result<Npy> read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return io_error("{}: cannot open", path);
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) return parse_error("{}: not an .npy file", path);
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  Npy out;
  auto d = header.find("'descr': '");
  if (d == std::string::npos) return parse_error("{}: no descr", path);
  out.descr = header.substr(d + 10, header.find('\'', d + 10) - d - 10);
  if (header.find("'fortran_order': False") == std::string::npos) return parse_error("{}: fortran order", path);
  auto s = header.find("'shape': (");
  auto e = header.find(')', s);
  std::string dims = header.substr(s + 10, e - s - 10);
  size_t i = 0;
  while (i < dims.size()) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    out.shape.push_back(std::stoll(dims.substr(i)));
    while (i < dims.size() && dims[i] != ',') ++i;
  }
  const int64_t esize = out.descr == "<f4" ? 4 : out.descr == "<i8" ? 8 : 0;
  if (!esize) return parse_error("{}: unsupported dtype {}", path, out.descr);
  out.data.resize(size_t(out.numel() * esize));
  f.read(out.data.data(), std::streamsize(out.data.size()));
  if (!f) return io_error("{}: truncated", path);
  return out;
}

}  // namespace flashseek::testing
