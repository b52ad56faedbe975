// Small parts the rooms own, each with its own state: every rank's memory limits (sizing), the
// record of a size the model refuses (sizing), the fault drills as one rank meets them (step).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "autoaccum/train/options.hpp"
#include "autoaccum/train/sizing/memory_limits.hpp"
#include "autoaccum/train/sizing/refusals.hpp"
#include "autoaccum/train/step/drills.hpp"

namespace autoaccum::train {
namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

TEST(MemoryLimits, OneSizeForEveryRankOrAListWhoseItemsRepeat) {
  const MemoryLimits one(16 * kMiB, {});
  EXPECT_EQ(one.given(0), 16 * kMiB);
  EXPECT_EQ(one.given(7), 16 * kMiB);
  EXPECT_EQ(one.option_text(), "16.0 MiB");
  EXPECT_EQ(one.text({3}), "16.0 MiB per rank");
  EXPECT_EQ(MemoryLimits(0, {}).option_text(), "none");
  EXPECT_EQ(MemoryLimits(0, {}).text({0}), "no --memory-limit");

  const MemoryLimits list(0, {8 * kMiB, 0});
  EXPECT_EQ(list.given(0), 8 * kMiB);
  EXPECT_EQ(list.given(1), 0);
  EXPECT_EQ(list.given(2), 8 * kMiB);
  EXPECT_EQ(list.option_text(), "8.0 MiB, none (rank i: item i mod 2)");
  EXPECT_EQ(list.text({1, 2}), "none on rank 1, 8.0 MiB on rank 2");
  EXPECT_FALSE(list.known()) << "nothing gathered yet";
  EXPECT_EQ(list.of(0), 0);
}

TEST(Refusals, OnlyASmallerSizeAfterAnOutOfMemoryIsTheModelRefusingIt) {
  Refusals refusals;
  refusals.start(64);
  EXPECT_FALSE(refusals.take("Expected more than 1 value per channel", true))
      << "the first size: the model's error is a failure";
  refusals.saw_out_of_memory();
  refusals.start(32);
  EXPECT_FALSE(refusals.take("internal", false)) << "autoaccum's own errors are never refusals";
  EXPECT_TRUE(refusals.take("Expected more than 1 value per channel", true));
  EXPECT_EQ(refusals.size(), 32);
  EXPECT_EQ(refusals.refused_after(), 64);
  EXPECT_EQ(refusals.what(), "Expected more than 1 value per channel");
  refusals.start(64);
  EXPECT_FALSE(refusals.take("too large?", true)) << "not below the largest tried";
}

TEST(Refusals, NoOutOfMemoryNoRefusal) {
  Refusals refusals;
  refusals.start(8);
  refusals.start(4);
  EXPECT_FALSE(refusals.take("error", true));
}

TEST(Drills, EachFiresOnlyForItsRankAndStep) {
  TrainOptions options;
  memory::OomInjection oom;
  oom.rank = 1;
  oom.step = 2;
  options.inject_oom = {oom};
  options.inject_overflow = {OverflowInjection{0, 3}};
  options.inject_slow = {SlowInjection{1, 3.0}};
  const Drills zero(options, 0), one(options, 1);
  EXPECT_FALSE(zero.out_of_memory(false, 8, 2));
  EXPECT_TRUE(one.out_of_memory(false, 8, 2));
  EXPECT_FALSE(one.out_of_memory(true, 8, 2)) << "in forward, not backward";
  EXPECT_FALSE(one.out_of_memory(false, 8, 1));
  EXPECT_TRUE(zero.overflow(3));
  EXPECT_FALSE(zero.overflow(2));
  EXPECT_FALSE(one.overflow(3));
  EXPECT_FALSE(zero.slow());
  EXPECT_TRUE(one.slow());
  EXPECT_DOUBLE_EQ(one.slow_factor(), 3.0);
  // A micro-batch that took 10 ms takes 30 ms in all: 20 ms more.
  const auto start = std::chrono::steady_clock::now() - std::chrono::milliseconds(10);
  const auto before = std::chrono::steady_clock::now();
  one.slow_down(start);
  EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(19));
}

}  // namespace
}  // namespace autoaccum::train
