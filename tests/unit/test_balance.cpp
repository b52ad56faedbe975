// Per-rank micro-batches and balanced shares: pure logic, every rank computing the same result.
#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/options.hpp"
#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"

namespace autoaccum::train {
namespace {

using Sizes = std::vector<std::int64_t>;

TEST(RankMicroBatches, GlobalScopeShrinksEveryRankWhenOneRunsOut) {
  RankMicroBatches m(3, 64, std::nullopt, {}, false, false);
  EXPECT_TRUE(m.after_oom({1}));
  EXPECT_EQ(m.sizes(), (Sizes{32, 32, 32}));
  EXPECT_EQ(m.describe(), "32");
}

TEST(RankMicroBatches, RankScopeShrinksOnlyTheRanksThatRanOut) {
  RankMicroBatches m(3, 64, std::nullopt, {}, false, true);
  EXPECT_TRUE(m.after_oom({0, 2}));
  EXPECT_TRUE(m.after_oom({0}));
  EXPECT_EQ(m.sizes(), (Sizes{16, 64, 32}));
  EXPECT_EQ(m.describe(), "16, 64, 32");
  EXPECT_EQ(m.accumulation(0, 42), 3);
}

TEST(RankMicroBatches, ARankAtOneOrAFixedSizeCannotShrink) {
  RankMicroBatches at_one(2, 1, std::nullopt, {}, false, true);
  EXPECT_FALSE(at_one.after_oom({1}));
  RankMicroBatches fixed(2, 64, 16, {}, false, true);
  EXPECT_FALSE(fixed.after_oom({0}));
  EXPECT_EQ(fixed.sizes(), (Sizes{16, 16}));
}

TEST(RankMicroBatches, RefineProbesPerRankAndResumedSizesStartEachRank) {
  RankMicroBatches m(2, 64, std::nullopt, {32, 64}, true, true);
  EXPECT_EQ(m.sizes(), (Sizes{32, 64}));
  EXPECT_TRUE(m.after_oom({1}));                        // rank 1: 64 failed, now 32
  EXPECT_EQ(m.after_success(), (std::vector<int>{1}));  // rank 1 probes between 32 and 64
  EXPECT_EQ(m.current(1), 48);
  EXPECT_TRUE(m.probing(1));
  EXPECT_FALSE(m.probing(0));
}

TEST(BalancedShares, ProportionalToSpeedInWholeRowsSummingToTheBatch) {
  EXPECT_EQ(balanced_shares(256, {2.0, 1.0}, {1, 1}), (Sizes{171, 85}));
  EXPECT_EQ(balanced_shares(256, {1.0, 1.0}, {1, 1}), (Sizes{128, 128}));
  EXPECT_EQ(balanced_shares(100, {3.0, 1.0, 1.0}, {1, 1, 1}), (Sizes{60, 20, 20}));
  const Sizes odd = balanced_shares(101, {1.0, 1.0, 1.0}, {1, 1, 1});
  EXPECT_EQ(std::accumulate(odd.begin(), odd.end(), std::int64_t{0}), 101);
  EXPECT_EQ(odd, (Sizes{34, 34, 33})) << "leftover rows go to the lowest ranks on ties";
}

TEST(BalancedShares, EveryRankKeepsAtLeastItsFloor) {
  // Rank 1 is 100x slower; its share would be ~2 rows but its micro-batch is 16.
  const Sizes s = balanced_shares(256, {100.0, 1.0}, {16, 16});
  EXPECT_EQ(s, (Sizes{240, 16}));
  const Sizes three = balanced_shares(90, {1000.0, 1.0, 1.0}, {10, 20, 5});
  EXPECT_EQ(three[1], 20);
  EXPECT_EQ(three[2], 5);
  EXPECT_EQ(three[0], 65);
}

TEST(BalancedShares, RejectsImpossibleInput) {
  EXPECT_THROW(balanced_shares(10, {1.0, 1.0}, {8, 8}), Error);
  EXPECT_THROW(balanced_shares(10, {1.0, 0.0}, {1, 1}), Error);
  EXPECT_THROW(balanced_shares(10, {1.0}, {1, 1}), Error);
}

TEST(ShareSchedule, AChangeAppliesFromItsStepAndEarlierStepsKeepTheirSplit) {
  ShareSchedule schedule(even_shares(10, 3));
  EXPECT_EQ(schedule.shares(0), (Sizes{3, 3, 4}));
  schedule.change(5, {5, 3, 2});
  EXPECT_EQ(schedule.shares(4), (Sizes{3, 3, 4}));
  EXPECT_EQ(schedule.shares(5), (Sizes{5, 3, 2}));
  EXPECT_EQ(schedule.offsets(9), (Sizes{0, 5, 8, 10}));
  schedule.change(9, {2, 2, 6});
  schedule.change(13, {1, 1, 8});
  schedule.change(17, {4, 4, 2});
  EXPECT_EQ(schedule.shares(16), (Sizes{1, 1, 8})) << "steps just before a change stay readable";
  EXPECT_EQ(schedule.shares(17), (Sizes{4, 4, 2}));
}

TEST(ShareSchedule, ReadsFromAnotherThreadSeeAWholeSplit) {
  ShareSchedule schedule(even_shares(100, 2));
  std::thread reader([&] {
    for (int i = 0; i < 20000; ++i) {
      const Sizes s = schedule.shares(1000000);
      ASSERT_EQ(s[0] + s[1], 100);
    }
  });
  for (std::int64_t step = 1; step < 20000; ++step)
    schedule.change(step, {step % 99 + 1, 100 - (step % 99 + 1)});
  reader.join();
}

TEST(Balance, ChangesEveryNStepsFromTheStepAfterNextInProportionToSpeed) {
  Balance balance(false, 90, 2, 2);
  EXPECT_EQ(balance.shares(0), (Sizes{45, 45}));
  // Step 1 measured: not a balancing step yet.
  EXPECT_FALSE(balance.measure(1, 10, {45, 45}, {1.0, 0.5}, {}));
  // Step 2: rank 0 ran 90 rows in 2 s, rank 1 in 1 s: twice as fast.
  const auto change = balance.measure(2, 10, {45, 45}, {1.0, 0.5}, {});
  ASSERT_TRUE(change);
  EXPECT_EQ(change->shares, (Sizes{30, 60}));
  EXPECT_EQ(change->rates, (Sizes{45, 90}));
  EXPECT_EQ(change->text(false),
            "step 2: rows per rank 30, 60 from step 3 (measured rows/s 45, 90)");
  EXPECT_EQ(balance.shares(2), (Sizes{45, 45})) << "the prefetcher may be reading it";
  EXPECT_EQ(balance.shares(3), (Sizes{30, 60}));
  // The same speeds again: the same split, no change to tell.
  EXPECT_FALSE(balance.measure(3, 10, {30, 60}, {1.0, 1.0}, {}));
  EXPECT_FALSE(balance.measure(4, 10, {30, 60}, {1.0, 1.0}, {}));
  // Never at the last step, and never without --balance.
  EXPECT_FALSE(balance.measure(9, 10, {30, 60}, {1.0, 9.0}, {}));
  EXPECT_FALSE(balance.measure(10, 10, {30, 60}, {1.0, 9.0}, {}))
      << "speeds changed, but no step follows";
  Balance even(false, 90, 2, 0);
  EXPECT_FALSE(even.measure(2, 10, {45, 45}, {1.0, 0.5}, {}));
}

TEST(Balance, FloorsAndDocumentsInPartsOfTheTokens) {
  Balance rows(false, 40, 2, 1);
  const auto floored = rows.measure(1, 10, {20, 20}, {10.0, 0.1}, {16, 16});
  ASSERT_TRUE(floored);
  EXPECT_EQ(floored->shares, (Sizes{16, 24})) << "a slow rank keeps its fixed micro-batch";
  Balance documents(true, 8, 2, 1);
  EXPECT_EQ(documents.total(), Balance::kTokenShares);
  const auto change = documents.measure(1, 10, {300, 100}, {1.0, 1.0}, {});
  ASSERT_TRUE(change);
  EXPECT_EQ(change->shares, (Sizes{750000, 250000}));
  EXPECT_EQ(
      change->text(true),
      "step 1: tokens per rank 75%, 25% of each batch from step 2 (measured tokens/s 300, 100)");
}

TEST(Balance, FollowedSharesAndARestoreOnlyOfSharesOfThisBatch) {
  Balance balance(false, 90, 2, 1);
  EXPECT_FALSE(balance.to_follow(0)) << "sizes start on the even split";
  ASSERT_TRUE(balance.measure(1, 10, {45, 45}, {1.0, 0.5}, {}));
  EXPECT_FALSE(balance.to_follow(1));
  EXPECT_EQ(balance.to_follow(2), (Sizes{30, 60}));
  EXPECT_FALSE(balance.to_follow(2));
  EXPECT_EQ(balance.followed(), (Sizes{30, 60}));

  Balance resumed(false, 90, 2, 1);
  EXPECT_FALSE(resumed.restore(5, {30, 61}, {30, 60}, {})) << "another global batch";
  EXPECT_FALSE(resumed.restore(5, {30, 30, 30}, {30, 30, 30}, {})) << "another number of ranks";
  EXPECT_EQ(resumed.shares(5), (Sizes{45, 45}));
  EXPECT_TRUE(resumed.restore(5, {40, 50}, {30, 60}, {}));
  EXPECT_EQ(resumed.shares(5), (Sizes{40, 50}));
  EXPECT_EQ(resumed.shares(6), (Sizes{30, 60}));
  EXPECT_EQ(resumed.followed(), (Sizes{40, 50})) << "no record: this step's shares";
  EXPECT_TRUE(resumed.restore(5, {40, 50}, {30, 60}, {45, 45}));
  EXPECT_EQ(resumed.followed(), (Sizes{45, 45}));
}

TEST(SlowInjection, ParsesAndRejectsBadFactors) {
  const auto all = parse_slow_injections("rank=1,factor=2.5;rank=0,factor=1");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].rank, 1);
  EXPECT_DOUBLE_EQ(all[0].factor, 2.5);
  EXPECT_THROW(parse_slow_injections("rank=1,factor=0"), UsageError);
  EXPECT_THROW(parse_slow_injections("rank=1,factor=-2"), UsageError);
  EXPECT_THROW(parse_slow_injections("rank=1"), UsageError);
  EXPECT_THROW(parse_slow_injections("rank=x,factor=2"), UsageError);
  EXPECT_THROW(parse_slow_injections("rank=1,speed=2"), UsageError);
}

}  // namespace
}  // namespace autoaccum::train
