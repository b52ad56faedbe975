// Prefetcher: one background thread loads the next batch while the current one trains.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "autoaccum/data/batch.hpp"

namespace autoaccum::data {

// Loads items first, first + 1, ..., end - 1 in order on its own thread, keeping at most one
// loaded item waiting (a double buffer: one being trained on, one ready or being read), so memory
// stays bounded at two batches. An exception from the loader is rethrown by next().
// The destructor stops the thread and joins it, even while a load is in progress.
class Prefetcher {
 public:
  using Loader = std::function<Batch(std::int64_t index)>;

  Prefetcher(Loader load, std::int64_t first, std::int64_t end);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next item, in order; blocks until it is loaded. Throws what the loader threw, or Error
  // past the end.
  Batch next();

  // Seconds next() spent waiting for the loader so far (the step's data stall).
  double waited_seconds() const noexcept { return waited_seconds_; }
  // CPU seconds the loader thread spent on the item next() returned last (reading, and
  // decompressing a compressed file: time taken from the cores that train, which waiting does
  // not show).
  double last_cpu_seconds() const noexcept { return last_cpu_seconds_; }

 private:
  void run();

  Loader load_;
  std::int64_t next_to_load_;
  std::int64_t next_to_give_;
  std::int64_t end_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Batch> ready_;
  double ready_cpu_seconds_ = 0.0;
  double last_cpu_seconds_ = 0.0;
  std::exception_ptr error_;
  bool stopping_ = false;
  double waited_seconds_ = 0.0;
  std::thread thread_;  // last: starts after every other member is initialised
};

}  // namespace autoaccum::data
