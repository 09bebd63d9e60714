#pragma once
// A fixed pool of worker threads for independent tasks (one layer each), with
// no allocation once it has its threads: run() hands the callable by pointer,
// never through std::function. Task t always runs on worker t % threads, so
// each worker's scratch sees the same tasks in the same order on every call and
// results do not depend on scheduling. No OpenMP: callers pick the count.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace flashcache {

class WorkerPool {
 public:
  WorkerPool() = default;
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() { stop(); }

  // Workers besides the caller's thread: threads - 1 of them (threads <= 1: none).
  // Resizing joins the old workers first; the same count is a no-op.
  void resize(int threads) {
    threads = threads < 1 ? 1 : threads;
    if (threads == this->threads()) return;
    stop();
    stop_ = false;
    generation_ = 0;
    workers_.reserve(static_cast<std::size_t>(threads - 1));
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { loop(w); });
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls f(task, worker) for task in [0, tasks); worker w < threads() runs the
  // tasks t with t % threads() == w (worker 0 is the calling thread). Returns
  // when all have run. f must not throw.
  template <class F>
  void run(std::int64_t tasks, F& f) {
    if (tasks <= 0) return;
    if (workers_.empty() || tasks == 1) {
      for (std::int64_t t = 0; t < tasks; ++t) f(t, 0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = [](void* ctx, std::int64_t t, int w) { (*static_cast<F*>(ctx))(t, w); };
      ctx_ = &f;
      tasks_ = tasks;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    start_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void work(int w) {
    const int n = threads();
    for (std::int64_t t = w; t < tasks_; t += n) fn_(ctx_, t, w);
  }

  void loop(int w) {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work(w);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  void (*fn_)(void*, std::int64_t, int) = nullptr;
  void* ctx_ = nullptr;
  std::int64_t tasks_ = 0;
};

}  // namespace flashcache
