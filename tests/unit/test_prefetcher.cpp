// Prefetcher: order, overlap of loading with work, error pass-through, clean shutdown.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>

#include "autoaccum/core/error.hpp"
#include "autoaccum/data/prefetcher.hpp"

namespace autoaccum::data {
namespace {

Batch numbered(std::int64_t index) {
  Batch b;
  b.add("i", torch::full({1}, index, torch::kInt64));
  return b;
}

TEST(Prefetcher, GivesItemsInOrder) {
  Prefetcher prefetcher(numbered, 3, 20);
  for (std::int64_t i = 3; i < 20; ++i) {
    EXPECT_EQ(prefetcher.next().get("i").item<std::int64_t>(), i);
  }
  EXPECT_THROW(prefetcher.next(), Error);
}

TEST(Prefetcher, LoadsTheNextItemWhileTheCurrentOneIsInUse) {
  // The consumer holds item 0 and waits until the loader has started item 1. Without a
  // background load this wait would time out.
  std::mutex mutex;
  std::condition_variable started;
  std::int64_t highest_started = -1;
  Prefetcher prefetcher(
      [&](std::int64_t index) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          highest_started = index;
        }
        started.notify_all();
        return numbered(index);
      },
      0, 3);
  Batch current = prefetcher.next();
  std::unique_lock<std::mutex> lock(mutex);
  const bool overlapped =
      started.wait_for(lock, std::chrono::seconds(10), [&] { return highest_started >= 1; });
  EXPECT_TRUE(overlapped) << "item 1 was not loaded while item 0 was in use";
  // Bounded: with item 1 ready and not taken, item 2 must not start.
  started.wait_for(lock, std::chrono::milliseconds(200), [&] { return highest_started >= 2; });
  EXPECT_EQ(highest_started, 1) << "the prefetcher ran more than one item ahead";
}

TEST(Prefetcher, ReaderErrorReachesTheConsumer) {
  Prefetcher prefetcher(
      [](std::int64_t index) -> Batch {
        if (index == 2) throw std::runtime_error("disk on fire at item 2");
        return numbered(index);
      },
      0, 5);
  EXPECT_EQ(prefetcher.next().get("i").item<std::int64_t>(), 0);
  EXPECT_EQ(prefetcher.next().get("i").item<std::int64_t>(), 1);
  try {
    prefetcher.next();
    FAIL() << "the loader's error must be rethrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk on fire at item 2");
  }
}

TEST(Prefetcher, DestructionDuringALoadJoinsCleanly) {
  std::atomic<int> loads{0};
  {
    Prefetcher prefetcher(
        [&](std::int64_t index) {
          ++loads;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return numbered(index);
        },
        0, 1000);
    prefetcher.next();
  }  // destroyed with a load in progress and most items never taken
  EXPECT_LE(loads.load(), 3);
}

TEST(Prefetcher, RecordsTimeSpentWaiting) {
  Prefetcher prefetcher(
      [](std::int64_t index) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return numbered(index);
      },
      0, 1);
  prefetcher.next();
  // The first item takes 50 ms to load and is asked for at once: most of that is waiting.
  EXPECT_GE(prefetcher.waited_seconds(), 0.03);
  EXPECT_LT(prefetcher.waited_seconds(), 5.0);
}

}  // namespace
}  // namespace autoaccum::data
