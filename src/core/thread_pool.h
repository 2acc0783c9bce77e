// A fixed pool of worker threads with a blocking parallel_for. Work is split into contiguous
// ranges; every element is computed by exactly one task, so results do not depend on the
// thread count (the CPU backend must be batch- and thread-invariant).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"

namespace flashseek {

class ThreadPool {
 public:
  // n_threads <= 0: std::thread::hardware_concurrency(). The calling thread also works.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` elements; blocks until done.
  // Nested calls from inside fn run serially on the calling thread.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t grain = 1);

  // Process-wide default pool: set_global_threads's size, else the hardware's.
  static ThreadPool& global();

  // Sizes the global pool (the CLI's --threads, called before the model loads): n in
  // 1..kMaxThreads. The pool is created on first use; once it exists, a different size is an error.
  static constexpr int kMaxThreads = 1024;
  static Status set_global_threads(int n);

 private:
  void worker_loop();
  bool run_one_chunk();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 1, next_ = 0, done_chunks_ = 0, total_chunks_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::mutex submit_mu_;
};

}  // namespace flashseek
