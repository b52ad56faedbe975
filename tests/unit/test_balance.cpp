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
