// MicroBatchPolicy and Schedule: pure logic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"
#include "autoaccum/train/step/schedule.hpp"

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

TEST(MicroBatchPolicy, FollowShareGrowsToTheShareWhileNothingRanOut) {
  MicroBatchPolicy p(256, std::nullopt);
  EXPECT_TRUE(p.follow_share(384, std::nullopt));  // no limit, no OOM: the whole share
  EXPECT_EQ(p.current(), 384);
  EXPECT_EQ(p.accumulation(384), 1);
  EXPECT_TRUE(p.follow_share(128, std::nullopt));  // a share below the size: runs it whole
  EXPECT_EQ(p.current(), 128);
  EXPECT_FALSE(p.follow_share(128, std::nullopt));
}

TEST(MicroBatchPolicy, FollowShareStaysWithinAPredictionAndBelowAFailure) {
  MicroBatchPolicy p(256, std::nullopt);
  // Predicted 300 fits in a share of 384: two micro-batches, evened out to 192.
  EXPECT_TRUE(p.follow_share(384, 300));
  EXPECT_EQ(p.current(), 192);
  // An out-of-memory at 192 halves to 96; 96 completes. Without a prediction the size no longer
  // grows beyond what ran; with one, never to the size that failed.
  ASSERT_EQ(p.after_oom(), 96);
  EXPECT_FALSE(p.after_success());
  p.follow_share(400, std::nullopt);
  EXPECT_EQ(p.current(), 80);  // at most 96, evened out: 400 = 5 x 80
  p.follow_share(400, 250);
  EXPECT_EQ(p.current(), 134);  // below 192: 191 -> three micro-batches of 134 (400 = 3 x 134 - 2)
  // A fixed size never follows.
  MicroBatchPolicy fixed(256, 64);
  EXPECT_FALSE(fixed.follow_share(384, std::nullopt));
  EXPECT_EQ(fixed.current(), 64);
}

TEST(MicroBatchPolicy, ResumeShareKeepsASizeGrownPastTheEvenShare) {
  // Even share 60; the balanced share had grown to 85 and the size followed it to 74.
  MicroBatchPolicy resumed(60, std::nullopt, 74);
  EXPECT_EQ(resumed.current(), 60);  // capped by the even share alone
  resumed.resume_share(85, 74);
  EXPECT_EQ(resumed.current(), 74);
  EXPECT_EQ(resumed.accumulation(85), 2);
  resumed.resume_share(40, 74);  // a share below the size: runs it whole
  EXPECT_EQ(resumed.current(), 40);
  // A fixed size is not a resumed one.
  MicroBatchPolicy fixed(60, 16);
  fixed.resume_share(85, 74);
  EXPECT_EQ(fixed.current(), 16);
}

TEST(MicroBatchPolicy, RegrowTriesTheSizeBeforeOnceAfterCleanSteps) {
  // A transient peak: 64 runs out once, 32 runs three clean steps, 64 is tried again and fits.
  MicroBatchPolicy transient(64, std::nullopt);
  transient.set_regrow(3);
  ASSERT_EQ(transient.after_oom(), 32);
  EXPECT_FALSE(transient.after_success());
  EXPECT_FALSE(transient.after_success());
  EXPECT_TRUE(transient.after_success());
  EXPECT_EQ(transient.current(), 64);
  EXPECT_TRUE(transient.regrowing());
  for (int step = 0; step < 10; ++step)
    EXPECT_FALSE(transient.after_success());
  EXPECT_EQ(transient.current(), 64);
  EXPECT_FALSE(transient.regrowing());

  // A lasting limit: the second try at 64 runs out, back to 32 for good (one more OOM).
  MicroBatchPolicy lasting(64, std::nullopt);
  lasting.set_regrow(3);
  ASSERT_EQ(lasting.after_oom(), 32);
  for (int step = 0; step < 2; ++step)
    lasting.after_success();
  ASSERT_TRUE(lasting.after_success());
  ASSERT_EQ(lasting.after_oom(), 32);
  EXPECT_FALSE(lasting.regrowing());
  for (int step = 0; step < 10; ++step)
    EXPECT_FALSE(lasting.after_success());
  EXPECT_EQ(lasting.current(), 32);
  // A later lowering is a new one: 32 runs out, 16 runs, 32 is tried once more.
  ASSERT_EQ(lasting.after_oom(), 16);
  for (int step = 0; step < 2; ++step)
    lasting.after_success();
  EXPECT_TRUE(lasting.after_success());
  EXPECT_EQ(lasting.current(), 32);

  // Off (0), and never for a fixed size.
  MicroBatchPolicy off(64, std::nullopt);
  ASSERT_EQ(off.after_oom(), 32);
  for (int step = 0; step < 200; ++step)
    EXPECT_FALSE(off.after_success());
}

TEST(RankMicroBatches, FollowSharesReportsTheRanksThatChanged) {
  RankMicroBatches sizes(2, 256, std::nullopt, {}, false, false);
  EXPECT_EQ(sizes.follow_shares({384, 128}, {std::nullopt, std::nullopt}),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(sizes.sizes(), (std::vector<std::int64_t>{384, 128}));
  EXPECT_EQ(sizes.follow_shares({384, 128}, {std::nullopt, std::nullopt}), std::vector<int>{});
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
