// Status / Result<T>: errors as values at every boundary (config, checkpoint, tokenizer input,
// HTTP, Redis, UCX). Inside the math, asserts state preconditions instead.
#pragma once
#include <cassert>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace flashseek {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // bad input from a user or a file (config field, request field)
  kNotFound,          // missing file, tensor, key
  kIoError,           // read/write/mmap failure
  kParseError,        // malformed JSON / safetensors header / tokenizer file
  kOutOfRange,        // index or length beyond a limit
  kUnimplemented,
  kInternal,
  kResourceExhausted, // queue full, out of memory budget
  kCancelled,
  kUnavailable,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok_status() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;
  // Prefixes context ("while loading X: ") to the message; no-op on OK.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status invalid_argument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status not_found(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status io_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kIoError, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status parse_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kParseError, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status out_of_range(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kOutOfRange, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}              // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {        // NOLINT(implicit)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace flashseek

#define FS_CONCAT_INNER(a, b) a##b
#define FS_CONCAT(a, b) FS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) is not OK.
#define FS_RETURN_IF_ERROR(expr)                         \
  do {                                                   \
    ::flashseek::Status _fs_st = (expr);                 \
    if (!_fs_st.ok()) return _fs_st;                     \
  } while (0)

// `FS_ASSIGN_OR_RETURN(auto x, make_x())`: unwraps a Result or returns its Status.
#define FS_ASSIGN_OR_RETURN(lhs, expr) \
  FS_ASSIGN_OR_RETURN_IMPL(FS_CONCAT(_fs_res_, __LINE__), lhs, expr)
#define FS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()
