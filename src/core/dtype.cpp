#include "core/dtype.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace flashseek {

namespace {
struct DTypeInfo {
  DType dt;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfos[] = {
    {DType::kF32, "F32", 4},   {DType::kF16, "F16", 2},       {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8},   {DType::kI64, "I64", 8},       {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},         {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E8M0, "F8_E8M0", 1},
};
}  // namespace

size_t dtype_size(DType dt) {
  for (const auto& i : kInfos) if (i.dt == dt) return i.size;
  return 0;
}

std::string_view dtype_name(DType dt) {
  for (const auto& i : kInfos) if (i.dt == dt) return i.name;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfos) if (i.name == name) return i.dt;
  return std::nullopt;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

}  // namespace flashseek
