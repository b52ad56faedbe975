// The collective watchdog's pieces that need no second rank: its messages and its thread.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "autoaccum/comm/nccl_communicator.hpp"
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

// NCCL's waits follow --collective-timeout: none at 0 (it was a fixed 5 minutes), else the
// watchdog's deadline and grace plus 10 s, so the watchdog names the missing ranks first.
TEST(NcclWait, TheDeadlineFollowsTheCollectiveTimeout) {
  Watchdog dog;
  dog.configure(milliseconds(0), 0);
  EXPECT_EQ(nccl_wait_limit(dog), std::nullopt);
  dog.configure(milliseconds(20000), 0);
  EXPECT_EQ(nccl_wait_limit(dog), milliseconds(20000 + 2000 + 10000));
  dog.configure(milliseconds(600000), 0);
  EXPECT_EQ(nccl_wait_limit(dog), milliseconds(600000 + 10000 + 10000));
  dog.configure(milliseconds(0), 0);
}

// The polls of a long NCCL wait stop spinning: after a few yields the pauses grow to a cap, so
// a waiting rank uses a small share of a core.
TEST(NcclWait, PollsBackOffToACap) {
  PollBackoff backoff;
  for (int i = 0; i < PollBackoff::kSpinPolls; ++i)
    EXPECT_EQ(backoff.next(), std::chrono::microseconds(0)) << i;
  std::chrono::microseconds previous(0), total(0);
  for (int i = 0; i < 100; ++i) {
    const auto pause = backoff.next();
    EXPECT_GE(pause, previous);
    EXPECT_GE(pause, PollBackoff::kFirstPause);
    EXPECT_LE(pause, PollBackoff::kLongestPause);
    previous = pause;
    total += pause;
  }
  EXPECT_EQ(previous, PollBackoff::kLongestPause);
  // 100 polls past the spin take most of 50 ms: at most ~100 wake-ups in 50 ms.
  EXPECT_GT(total, milliseconds(40));
}

TEST(Watchdog, TheLineGroupsMissingRanksByHost) {
  TimeoutReport report;
  report.collective = "MPI_Allreduce(float, sum)";
  report.timeout = milliseconds(10000);
  report.hosts = {"node1", "node1", "node2", "node2"};
  report.present = {0, 1};
  report.silent = {2, 3};
  report.context = "in step 5 of 9; last checkpoint: c.h5 at step 4";
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: MPI_Allreduce(float, sum) did not complete within 10 s "
            "(--collective-timeout): ranks 2, 3 on node2 do not answer (process, node or link "
            "down); ranks 0, 1 waited; in step 5 of 9; last checkpoint: c.h5 at step 4");
  report.silent = {3};
  report.running = {1};
  report.present = {0, 2};
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: MPI_Allreduce(float, sum) did not complete within 10 s "
            "(--collective-timeout): rank 1 on node1 did not reach it (still running); rank 3 on "
            "node2 does not answer (process, node or link down); ranks 0, 2 waited; in step 5 of "
            "9; last checkpoint: c.h5 at step 4");
  report.silent = {};
  report.running = {1, 3};
  report.elsewhere = {2};
  report.present = {0};
  report.context = "";
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: MPI_Allreduce(float, sum) did not complete within 10 s "
            "(--collective-timeout): ranks 1 on node1, 3 on node2 did not reach it (still "
            "running); rank 2 waited in a different collective; rank 0 waited");
}

TEST(Watchdog, TheLineSaysWhenEveryRankArrivedButTheCollectiveStalled) {
  TimeoutReport report;
  report.collective = "MPI_Bcast";
  report.timeout = milliseconds(4000);
  report.present = {0, 1};
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: every rank reached MPI_Bcast, but it did not complete within 4 s "
            "(--collective-timeout): a link or a rank failed inside it");
  report.located = false;
  report.rank = 3;
  report.context = "in step 2 of 4";
  EXPECT_EQ(describe_timeout(report),
            "collective timeout: MPI_Bcast did not complete within 4 s (--collective-timeout) on "
            "rank 3; which ranks are missing is not known (this MPI gives no "
            "MPI_THREAD_MULTIPLE); in step 2 of 4");
}

TEST(Watchdog, TallySortsTheAnswersByWhereEachRankIs) {
  const WatchState mine{12, 10500};
  const std::vector<std::optional<WatchState>> answers = {
      WatchState{12, 10400}, std::nullopt,       std::nullopt,         WatchState{-1, 0},
      WatchState{9, 3},      WatchState{12, 20}, WatchState{11, 9000}, WatchState{13, 10}};
  const TimeoutReport report = tally(2, mine, answers);
  // 2 is this rank (its own answer); 6 and 7 wait in the collective before and after this one
  // (a link that failed inside it let some ranks through).
  EXPECT_EQ(report.present, (std::vector<int>{0, 2, 5, 6, 7}));
  EXPECT_EQ(report.silent, (std::vector<int>{1}));
  EXPECT_EQ(report.running, (std::vector<int>{3}));
  EXPECT_EQ(report.elsewhere, (std::vector<int>{4}));
  EXPECT_EQ(report.rank, 2);
}

// Stands in for the other ranks' watchdog threads: what each answers (nullopt: nothing, as from
// a dead node), and what this rank's thread sent.
class FakeChannel final : public WatchChannel {
 public:
  explicit FakeChannel(std::vector<std::optional<WatchState>> others)
      : others_(std::move(others)), hosts_{"a", "b", "c", "d"} {}
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(others_.size()) + 1; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  void announce(const WatchState&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t r = 0; r < others_.size(); ++r) {
      if (others_[r]) answers_.push_back({static_cast<int>(r) + 1, *others_[r]});
    }
  }
  void answer(int to, const WatchState& mine) override {
    std::lock_guard<std::mutex> lock(mutex_);
    sent_.push_back({to, mine});
  }
  std::optional<WatchState> next_announcement(int& from) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (asked_by_ < 0) return std::nullopt;
    from = asked_by_;
    asked_by_ = -1;
    return WatchState{};
  }
  std::optional<WatchState> next_answer(int& from) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (answers_.empty()) return std::nullopt;
    from = answers_.front().first;
    const WatchState answer = answers_.front().second;
    answers_.erase(answers_.begin());
    return answer;
  }
  void ask(int from) {
    std::lock_guard<std::mutex> lock(mutex_);
    asked_by_ = from;
  }
  std::vector<std::pair<int, WatchState>> sent() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sent_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::optional<WatchState>> others_;
  std::vector<std::string> hosts_;
  std::vector<std::pair<int, WatchState>> answers_, sent_;
  int asked_by_ = -1;
};

std::vector<std::pair<int, WatchState>> wait_for_answers(FakeChannel& channel, std::size_t n) {
  for (int i = 0; i < 200 && channel.sent().size() < n; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  return channel.sent();
}

TEST(Watchdog, TheThreadAnswersWhereItsRankIs) {
  FakeChannel channel({std::nullopt, std::nullopt});
  Watchdog dog;
  dog.attach(&channel);
  dog.configure(milliseconds(60000), 0);
  channel.ask(2);  // outside any collective
  auto sent = wait_for_answers(channel, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].first, 2);
  EXPECT_EQ(sent[0].second.collective, -1);
  { const Watchdog::Guard first(dog, "MPI_Barrier"); }
  const Watchdog::Guard second(dog, "MPI_Allreduce(float, sum)");
  std::this_thread::sleep_for(milliseconds(300));
  channel.ask(1);  // inside the second watched collective, for ~300 ms
  sent = wait_for_answers(channel, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].first, 1);
  EXPECT_EQ(sent[1].second.collective, 2);
  EXPECT_GE(sent[1].second.waited_ms, 250);
  EXPECT_LT(sent[1].second.waited_ms, 5000);
  dog.configure(milliseconds(0), 0);
  dog.detach(&channel);
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
      "autoaccum: error: collective timeout: MPI_Allreduce\\(float, sum\\) did not complete "
      "within 0.2 s \\(--collective-timeout\\) on rank 7; which ranks are missing is not known "
      ".*; in step 3 of 8\n(.|\n)*last words: collective timeout");
}

TEST(WatchdogDeathTest, TheRankThatWaitedNamesTheOthersFromTheirAnswers) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // Rank 1 waits too, rank 2 runs elsewhere, rank 3 does not answer.
        FakeChannel channel({WatchState{1, 150}, WatchState{-1, 0}, std::nullopt});
        Watchdog dog;
        dog.attach(&channel);
        dog.configure(milliseconds(200), 0);
        dog.set_context("in step 3 of 8");
        const Watchdog::Guard guard(dog, "MPI_Allreduce(float, sum)");
        std::this_thread::sleep_for(std::chrono::seconds(5));
        std::fprintf(stderr, "still alive\n");
        std::exit(0);
      },
      ::testing::ExitedWithCode(5),
      "^autoaccum: error: collective timeout: MPI_Allreduce\\(float, sum\\) did not complete "
      "within 0.2 s \\(--collective-timeout\\): rank 2 on c did not reach it \\(still "
      "running\\); rank 3 on d does not answer \\(process, node or link down\\); ranks 0, 1 "
      "waited; in step 3 of 8\n$");
}

TEST(WatchdogDeathTest, LastWordsThatHangDoNotKeepTheJobFromEnding) {
  // Rank 0's last words write the run log; when the file system is what hangs, the job must
  // still end (it used to wait for the write forever, never reaching MPI_Abort).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog dog;
        dog.configure(milliseconds(200), 0);
        dog.set_last_words(
            [](const std::string&) { std::this_thread::sleep_for(std::chrono::hours(1)); });
        const Watchdog::Guard guard(dog, "MPI_Allreduce(float, sum)");
        std::this_thread::sleep_for(std::chrono::seconds(60));
        std::fprintf(stderr, "still alive\n");
        std::exit(0);
      },
      ::testing::ExitedWithCode(5),
      "autoaccum: rank 0: warning: the run log could not be written within 5 s \\(a hung file "
      "system\\?\\); ending the job without it\n$");
}

TEST(WatchdogDeathTest, AMainThreadWhoseCollectiveEndsDuringTheGraceGoesNoFurther) {
  // Rank 1 arrives late, within the grace period: rank 0's collective completes while its
  // watchdog is already asking and about to abort. The main thread must not go on into the next
  // collective (or tear down the state the last words use).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        FakeChannel channel({std::nullopt});
        Watchdog dog;
        dog.attach(&channel);
        dog.configure(milliseconds(200), 0);
        {
          const Watchdog::Guard guard(dog, "MPI_Allreduce(float, sum)");
          std::this_thread::sleep_for(milliseconds(600));
        }
        const Watchdog::Guard next(dog, "MPI_Allreduce(float, sum)");
        std::fprintf(stderr, "went on into the next collective\n");
        std::exit(0);
      },
      ::testing::ExitedWithCode(5),
      "^autoaccum: error: collective timeout: MPI_Allreduce\\(float, sum\\) did not complete "
      "within 0.2 s \\(--collective-timeout\\): rank 1 on b does not answer \\(process, node "
      "or link down\\); rank 0 waited\n$");
}

}  // namespace
}  // namespace autoaccum::comm
