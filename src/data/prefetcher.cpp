// Prefetcher: a one-slot hand-off between the loader thread and the trainer.
#include "autoaccum/data/prefetcher.hpp"

#include <chrono>

#include "autoaccum/core/error.hpp"

namespace autoaccum::data {

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
    try {
      loaded = load_(index);
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failure) {
        error_ = failure;
      } else {
        ready_ = std::move(loaded);
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
  ready_.reset();
  ++next_to_give_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace autoaccum::data
