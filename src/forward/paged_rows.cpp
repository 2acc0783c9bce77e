#include "forward/paged_rows.h"

#include <atomic>

namespace flashseek::forward {

namespace {
std::atomic<uint64_t> g_next_page_id{1};
}  // namespace

PagedRows::PagedRows(int64_t width, int64_t rows_per_page) { reset(width, rows_per_page); }

void PagedRows::reset(int64_t width, int64_t rows_per_page) {
  width_ = std::max<int64_t>(1, width);
  rpp_ = std::max<int64_t>(1, rows_per_page);
  full_.clear();
  tail_.clear();
}

void PagedRows::seal_tail() {
  auto page = std::make_shared<Page>();
  page->id = g_next_page_id.fetch_add(1, std::memory_order_relaxed);
  page->data = std::move(tail_);
  full_.push_back(std::move(page));
  tail_ = {};
}

void PagedRows::append(const float* rows, int64_t n) {
  while (n > 0) {
    const int64_t take = std::min(n, rpp_ - tail_rows());
    if (tail_.capacity() < size_t(rpp_ * width_)) tail_.reserve(size_t(rpp_ * width_));
    tail_.insert(tail_.end(), rows, rows + take * width_);
    rows += take * width_;
    n -= take;
    if (tail_rows() == rpp_) seal_tail();
  }
}

void PagedRows::truncate(int64_t n) {
  n = std::max<int64_t>(0, n);
  if (n >= size()) return;
  const int64_t keep_full = n / rpp_, rest = n - keep_full * rpp_;
  if (keep_full < int64_t(full_.size())) {
    // The cut lies inside (or at the start of) a sealed page: its kept rows become the tail.
    const std::vector<float>& src = full_[size_t(keep_full)]->data;
    tail_.assign(src.begin(), src.begin() + rest * width_);
    full_.resize(size_t(keep_full));
  } else {
    tail_.resize(size_t(rest * width_));
  }
}

std::vector<float> PagedRows::to_vector() const {
  std::vector<float> out;
  out.reserve(size_t(size() * width_));
  for (const auto& p : full_) out.insert(out.end(), p->data.begin(), p->data.end());
  out.insert(out.end(), tail_.begin(), tail_.end());
  return out;
}

size_t PagedRows::shared_bytes() const { return full_.size() * size_t(rpp_ * width_) * sizeof(float); }

size_t PagedRows::private_bytes() const {
  return tail_.size() * sizeof(float) + full_.size() * sizeof(std::shared_ptr<const Page>);
}

}  // namespace flashseek::forward
