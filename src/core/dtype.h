// Element types met in checkpoints and in engine buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashseek {

enum class DType : uint8_t {
  kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool,
  kF8E4M3,   // FP8 e4m3fn ("F8_E4M3" in safetensors)
  kF8E8M0,   // UE8M0 scale ("F8_E8M0")
};

// Bytes per element (packed FP4 is stored as I8/U8 with two values a byte).
size_t dtype_size(DType dt);
// Safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dt);
std::optional<DType> dtype_from_name(std::string_view name);

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "[3, 4]"

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace flashseek
