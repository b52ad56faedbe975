// Prefetcher: a one-slot hand-off between the loader thread and the trainer.
#include "autoaccum/data/prefetcher.hpp"

#include <time.h>

#include <chrono>

#include "autoaccum/core/error.hpp"

namespace autoaccum::data {
namespace {

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

Prefetcher::Prefetcher(Loader load, std::int64_t first, std::int64_t end)
    : load_(std::move(load)),
      next_to_load_(first),
      next_to_give_(first),
      end_(end),
      thread_([this] { run(); }) {}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::run() {
  for (;;) {
    std::int64_t index = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !ready_.has_value(); });
      if (stopping_ || next_to_load_ >= end_ || error_) return;
      index = next_to_load_;
    }
    // Load outside the lock: the trainer can take the previous item meanwhile.
    std::optional<Batch> loaded;
    std::exception_ptr failure;
    const double cpu_start = thread_cpu_seconds();
    try {
      loaded = load_(index);
    } catch (...) {
      failure = std::current_exception();
    }
    const double cpu = thread_cpu_seconds() - cpu_start;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure) {
        error_ = failure;
      } else {
        ready_ = std::move(loaded);
        ready_cpu_seconds_ = cpu;
        ++next_to_load_;
      }
    }
    changed_.notify_all();
    if (failure) return;
  }
}

Batch Prefetcher::next() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (next_to_give_ >= end_) {
    throw Error("Prefetcher::next: all " + std::to_string(end_) + " items were already taken");
  }
  changed_.wait(lock, [&] { return ready_.has_value() || error_; });
  waited_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!ready_ && error_) std::rethrow_exception(error_);
  Batch batch = std::move(*ready_);
  last_cpu_seconds_ = ready_cpu_seconds_;
  ready_.reset();
  ++next_to_give_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace autoaccum::data
