// The collective watchdog's pieces that need no second rank: its messages and its thread.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "autoaccum/comm/watchdog.hpp"

namespace autoaccum::comm {
namespace {

using std::chrono::milliseconds;

TEST(Watchdog, RankRangesJoinRunsOfThreeOrMore) {
  EXPECT_EQ(rank_ranges({}), "");
  EXPECT_EQ(rank_ranges({4}), "4");
  EXPECT_EQ(rank_ranges({8, 7, 1, 2, 3, 5, 3}), "1-3, 5, 7, 8");
  EXPECT_EQ(rank_ranges({0, 1, 2, 3, 4, 5, 6, 7, 9}), "0-7, 9");
}

TEST(Watchdog, DurationsReadAsAPersonWouldWriteThem) {
  EXPECT_EQ(duration_text(milliseconds(3000)), "3 s");
  EXPECT_EQ(duration_text(milliseconds(500)), "0.5 s");
  EXPECT_EQ(duration_text(milliseconds(600000)), "10 min");
  EXPECT_EQ(duration_text(milliseconds(90000)), "90 s");
}

TEST(Watchdog, GraceIsATenthOfTheTimeoutBetweenOneAndTenSeconds) {
  EXPECT_EQ(grace_period(milliseconds(3000)), milliseconds(1000));
  EXPECT_EQ(grace_period(milliseconds(50000)), milliseconds(5000));
  EXPECT_EQ(grace_period(milliseconds(600000)), milliseconds(10000));
}

TEST(Watchdog, TheLineGroupsMissingRanksByHost) {
  TimeoutReport report;
  report.collective = "MPI_Allreduce(float, sum)";
  report.timeout = milliseconds(10000);
  report.hosts = {"node1", "node1", "node2", "node2"};
  report.present = {0, 1};
  report.absent = {2, 3};
  report.context = "in step 5 of 9; last checkpoint: c.h5 at step 4";
  EXPECT_EQ(
      describe_timeout(report),
      "collective timeout: ranks 2, 3 on node2 did not reach MPI_Allreduce(float, sum) within "
      "10 s (--collective-timeout; ranks 0, 1 waited) in step 5 of 9; last checkpoint: c.h5 "
      "at step 4");
  report.absent = {1, 3};
  report.present = {0, 2};
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: ranks 1 on node1, 3 on node2 did not reach "
            "MPI_Allreduce(float, sum) within 10 s (--collective-timeout; ranks 0, 2 waited) in "
            "step 5 of 9; last checkpoint: c.h5 at step 4");
}

TEST(Watchdog, TheLineSaysWhenEveryRankArrivedButTheCollectiveStalled) {
  TimeoutReport report;
  report.collective = "MPI_Bcast";
  report.timeout = milliseconds(4000);
  report.present = {0, 1};
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: every rank reached MPI_Bcast, but it did not complete within 4 s "
            "(--collective-timeout): a link or a rank failed inside it");
}

TEST(Watchdog, ACollectiveShorterThanTheDeadlineNeverFires) {
  Watchdog dog;
  dog.configure(milliseconds(300), 0);
  for (int i = 0; i < 20; ++i) {
    const Watchdog::Guard guard(dog, "a short collective");
    std::this_thread::sleep_for(milliseconds(50));
  }
  // Idle (disarmed) time is not counted either.
  std::this_thread::sleep_for(milliseconds(800));
  dog.configure(milliseconds(0), 0);
  EXPECT_FALSE(dog.enabled());
}

TEST(WatchdogDeathTest, AStalledCollectiveEndsTheProcessWithCodeFiveAfterItsLastWords) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog dog;
        dog.configure(milliseconds(200), 7);
        dog.set_context("in step 3 of 8");
        dog.set_last_words([](const std::string& message) {
          std::fprintf(stderr, "last words: %s\n", message.c_str());
        });
        const Watchdog::Guard guard(dog, "MPI_Allreduce(float, sum)");
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::fprintf(stderr, "still alive\n");
        std::exit(0);
      },
      ::testing::ExitedWithCode(5),
      "rank 7: error: collective timeout: every rank reached MPI_Allreduce\\(float, sum\\), but "
      "it did not complete within 0.2 s .*inside it, in step 3 of 8\n(.|\n)*last words: collective "
      "timeout");
}

}  // namespace
}  // namespace autoaccum::comm
