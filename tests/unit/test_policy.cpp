// MicroBatchPolicy and Schedule: pure logic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/micro_batch.hpp"
#include "autoaccum/train/schedule.hpp"

namespace autoaccum::train {
namespace {

TEST(MicroBatchPolicy, AutoHalvesToOneThenStops) {
  MicroBatchPolicy p(100, std::nullopt);
  EXPECT_TRUE(p.automatic());
  EXPECT_EQ(p.current(), 100);
  EXPECT_EQ(p.accumulation(100), 1);
  std::vector<std::int64_t> sizes;
  while (auto next = p.after_oom())
    sizes.push_back(*next);
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{50, 25, 12, 6, 3, 1}));
  EXPECT_EQ(p.current(), 1);
  EXPECT_EQ(p.accumulation(100), 100);
}

TEST(MicroBatchPolicy, AccumulationCoversUnevenParts) {
  MicroBatchPolicy p(7, 3);
  EXPECT_EQ(p.accumulation(7), 3);
  EXPECT_EQ(p.accumulation(6), 2);
}

TEST(MicroBatchPolicy, FixedHasNoNextSize) {
  MicroBatchPolicy p(64, 16);
  EXPECT_FALSE(p.automatic());
  EXPECT_FALSE(p.after_oom().has_value());
  EXPECT_THROW(MicroBatchPolicy(64, 65), UsageError);
  EXPECT_THROW(MicroBatchPolicy(64, 0), UsageError);
}

TEST(MicroBatchPolicy, ResumesAtTheLearnedSize) {
  EXPECT_EQ(MicroBatchPolicy(64, std::nullopt, 8).current(), 8);
  EXPECT_EQ(MicroBatchPolicy(64, std::nullopt, 1000).current(), 64);
}

// A device that holds `capacity` rows: the policy's sizes over a run of steps.
std::vector<std::int64_t> sizes_until_settled(MicroBatchPolicy& p, std::int64_t capacity, int steps,
                                              int* ooms) {
  std::vector<std::int64_t> used;
  for (int step = 0; step < steps; ++step) {
    while (p.current() > capacity) {
      ++*ooms;
      if (!p.after_oom()) return used;
    }
    used.push_back(p.current());
    p.after_success();
  }
  return used;
}

TEST(MicroBatchPolicy, RefineBisectsUpToTheLargestSizeThatFits) {
  for (std::int64_t capacity : {1, 7, 80, 95, 200, 511, 512}) {
    MicroBatchPolicy halve(512, std::nullopt), refine(512, std::nullopt, std::nullopt, true);
    int halve_ooms = 0, refine_ooms = 0;
    const auto h = sizes_until_settled(halve, capacity, 30, &halve_ooms);
    const auto r = sizes_until_settled(refine, capacity, 30, &refine_ooms);
    // Halving: powers-of-two fractions of 512; never grows.
    std::int64_t expected = 512;
    while (expected > capacity)
      expected /= 2;
    EXPECT_EQ(h.back(), expected) << capacity;
    // Refining: never a size above the capacity, settles within 1/16 below it, never below
    // what halving found, and the probes cost a bounded number of extra OOMs.
    EXPECT_LE(r.back(), capacity);
    EXPECT_GE(r.back(), expected) << capacity;
    EXPECT_GE(r.back() + std::max<std::int64_t>(1, r.back() / 16), capacity) << capacity;
    EXPECT_EQ(r[r.size() - 1], r[r.size() - 2]) << "settled before the end: " << capacity;
    EXPECT_LE(refine_ooms, halve_ooms + 5) << capacity;
  }
  MicroBatchPolicy fixed(64, 16, std::nullopt, true);
  EXPECT_FALSE(fixed.after_success());
  EXPECT_EQ(fixed.current(), 16);
}

TEST(MicroBatchPolicy, RefineWithHalvingWhenAFittedSizeStopsFitting) {
  MicroBatchPolicy p(512, std::nullopt, std::nullopt, true);
  int ooms = 0;
  sizes_until_settled(p, 100, 30, &ooms);
  const std::int64_t settled = p.current();
  ASSERT_LE(settled, 100);
  // Memory got tighter (say fragmentation): the settled size itself fails.
  const auto after = sizes_until_settled(p, 40, 30, &ooms);
  EXPECT_LE(after.back(), 40);
  EXPECT_GE(after.back() + std::max<std::int64_t>(1, after.back() / 16), 40);
}

TEST(Schedule, WarmupThenCosine) {
  Schedule s = make_schedule(1.0, 4, 14, "cosine");
  EXPECT_DOUBLE_EQ(s.lr(0), 0.25);
  EXPECT_DOUBLE_EQ(s.lr(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(4), 1.0);
  EXPECT_NEAR(s.lr(13), 0.0, 1e-12);
  EXPECT_LT(s.lr(9), s.lr(8));
  Schedule c = make_schedule(0.1, 0, 10, "constant");
  EXPECT_DOUBLE_EQ(c.lr(9), 0.1);
  EXPECT_THROW(make_schedule(0.1, 0, 10, "linear"), UsageError);
}

}  // namespace
}  // namespace autoaccum::train
