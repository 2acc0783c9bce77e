// Append-only rows of a fixed width stored in fixed-size pages (DESIGN.md §3): compressed KV
// and indexer keys of one sequence. Full pages are immutable and shared between copies
// (std::shared_ptr<const Page>), so copying a state with N full pages copies N pointers; only
// the last, partial page (the tail, < rows_per_page rows) is private and copied by value.
#pragma once
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace flashseek::forward {

inline constexpr int64_t kDefaultRowsPerPage = 64;

class PagedRows {
 public:
  // One sealed page: exactly rows_per_page rows, never written after sealing.
  struct Page {
    uint64_t id = 0;           // process-unique, assigned at sealing (dedup key for caches)
    std::vector<float> data;   // [rows_per_page, width]
  };
  // Read-only view of the storage: the full pages in order, then the tail rows.
  struct View {
    std::span<const std::shared_ptr<const Page>> full;
    std::span<const float> tail;  // [size() − full.size()·rows_per_page, width]
  };

  PagedRows() = default;  // width 0: holds nothing until reset()
  // width ≥ 1 and rows_per_page ≥ 1 (smaller values are raised to 1: geometry comes from the
  // model config, never from user input).
  explicit PagedRows(int64_t width, int64_t rows_per_page = kDefaultRowsPerPage);

  int64_t width() const { return width_; }
  int64_t rows_per_page() const { return rpp_; }
  int64_t size() const { return int64_t(full_.size()) * rpp_ + tail_rows(); }  // rows
  bool empty() const { return size() == 0; }

  // Row i (0 ≤ i < size()): `width` contiguous floats, valid until the row is truncated away.
  const float* row(int64_t i) const {
    const int64_t p = i / rpp_;
    if (p < int64_t(full_.size())) return full_[size_t(p)]->data.data() + (i - p * rpp_) * width_;
    return tail_.data() + (i - p * rpp_) * width_;
  }

  // Appends n rows ([n, width] floats at `rows`); full pages are sealed as they fill.
  void append(const float* rows, int64_t n);
  // Appends rows.size() / width rows; rows.size() must be a multiple of width (width > 0).
  void append(std::span<const float> rows) {
    assert(width_ > 0 && int64_t(rows.size()) % width_ == 0);
    if (width_ > 0) append(rows.data(), int64_t(rows.size()) / width_);
  }

  // Drops rows ≥ n (no-op when n ≥ size()). Cutting into a full page turns its kept rows into a
  // private tail copy; the page itself (maybe shared with a clone) is never modified.
  void truncate(int64_t n);
  void clear() { truncate(0); }
  // Empties and sets a new geometry.
  void reset(int64_t width, int64_t rows_per_page = kDefaultRowsPerPage);

  // Calls f(first_row, ptr, n_rows) for each contiguous run of rows in [begin, end), in order.
  template <typename F>
  void for_each_run(int64_t begin, int64_t end, F&& f) const {
    for (int64_t r = begin; r < end;) {
      const int64_t n = std::min(end, (r / rpp_ + 1) * rpp_) - r;
      f(r, row(r), n);
      r += n;
    }
  }

  View pages() const { return {full_, tail_}; }
  // All rows, contiguous [size(), width] (serialisation, tests).
  std::vector<float> to_vector() const;

  // Bytes of sealed pages (shareable: a clone references them, it does not copy them).
  size_t shared_bytes() const;
  // Bytes only this object owns: the tail plus the page-pointer table.
  size_t private_bytes() const;

 private:
  int64_t tail_rows() const { return width_ ? int64_t(tail_.size()) / width_ : 0; }
  void seal_tail();

  int64_t width_ = 0, rpp_ = kDefaultRowsPerPage;
  std::vector<std::shared_ptr<const Page>> full_;
  std::vector<float> tail_;  // [tail rows < rpp_, width]
};

}  // namespace flashseek::forward
