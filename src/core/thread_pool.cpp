#include "core/thread_pool.h"

#include <algorithm>

namespace flashseek {

namespace {
thread_local bool t_inside_pool = false;

// The global pool's requested size (0: the hardware's) and whether the pool exists yet.
std::mutex g_global_mu;
int g_global_threads = 0;
bool g_global_made = false;
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

bool ThreadPool::run_one_chunk() {
  int64_t begin;
  const std::function<void(int64_t, int64_t)>* job;
  int64_t end;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!job_ || next_ >= job_n_) return false;
    begin = next_;
    end = std::min(job_n_, begin + job_chunk_);
    next_ = end;
    job = job_;
  }
  t_inside_pool = true;
  (*job)(begin, end);
  t_inside_pool = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (++done_chunks_ == total_chunks_) cv_done_.notify_all();
  }
  return true;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || (job_ && generation_ != seen && next_ < job_n_); });
      if (stop_) return;
      seen = generation_;
    }
    while (run_one_chunk()) {
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || t_inside_pool || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);
  const int64_t max_chunks = int64_t(size()) * 4;
  const int64_t chunk = std::max(grain, (n + max_chunks - 1) / max_chunks);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    next_ = 0;
    done_chunks_ = 0;
    total_chunks_ = (n + chunk - 1) / chunk;
    ++generation_;
  }
  cv_work_.notify_all();
  while (run_one_chunk()) {
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return done_chunks_ == total_chunks_; });
  job_ = nullptr;
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    std::lock_guard<std::mutex> lk(g_global_mu);
    g_global_made = true;
    return g_global_threads;
  }());
  return pool;
}

Status ThreadPool::set_global_threads(int n) {
  if (n < 1 || n > kMaxThreads) return invalid_argument("--threads {}: expected 1..{}", n, kMaxThreads);
  {
    std::lock_guard<std::mutex> lk(g_global_mu);
    if (!g_global_made) {
      g_global_threads = n;
      return {};
    }
  }
  if (global().size() != n)
    return invalid_argument("--threads {}: the CPU thread pool already runs {} threads", n, global().size());
  return {};
}

}  // namespace flashseek
