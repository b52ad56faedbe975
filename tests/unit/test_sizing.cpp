// Sizing alone, on one process standing for every rank: an agreed out-of-memory halves the sizes
// (or ends the run in one line when a size is fixed), the memory probe runs once and only with
// a limit to predict against, and a checkpoint's sizes continue on the same ranks and map onto
// another number of ranks as docs/design.md says.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "autoaccum/train/sizing/sizing.hpp"
#include "test_comm.hpp"
#include "test_rows_file.hpp"

namespace autoaccum::train {
namespace {

// Every rank's value is this process's: a limit gathered is the same on every rank.
class SameOnEveryRank : public test::TestComm {
 public:
  using TestComm::TestComm;
  void allgather(const void* mine, std::size_t bytes, void* all) override {
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<char*>(all) + static_cast<std::size_t>(r) * bytes, mine, bytes);
  }
};

class SizingTest : public testing::Test {
 protected:
  std::string dir = testing::TempDir() + "/autoaccum_sizing_" + std::to_string(::getpid());
  std::string data;
  void SetUp() override {
    ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
    data = test::write_rows(dir + "/a.h5", 100, 5, 4);
  }
  void TearDown() override { (void)system(("rm -rf " + dir).c_str()); }

  TrainOptions options() const {
    TrainOptions o;
    o.data = {data};
    o.global_batch = 32;
    o.steps = 10;
    return o;
  }

  // A feed and sizing for rank 0 of `world`, started without a checkpoint.
  struct Rank {
    SameOnEveryRank comm;
    DataFeed feed;
    Sizing sizing;
    Rank(const TrainOptions& o, int world, std::int64_t limit)
        : comm(0, world), feed(o, 0, world), sizing(o, comm, feed) {
      feed.expand_paths();
      feed.open(false);
      sizing.gather_limits(limit);
    }
  };

  // Rank 1 of 2 ran out of memory in backward.
  static AttemptOutcome rank_one_ran_out() {
    AttemptOutcome outcome;
    outcome.out_of_memory = {1};
    outcome.peak_bytes = {1000, 3000};
    outcome.peak_shapes.assign(2, MicroBatchShape{});
    outcome.base_bytes = {0, 0};
    outcome.phases = {AttemptPhase::kNone, AttemptPhase::kBackward};
    return outcome;
  }
};

TEST_F(SizingTest, AnOutOfMemoryHalvesEveryRanksAutomaticSize) {
  const TrainOptions o = options();
  Rank rank(o, 2, 0);
  rank.sizing.start({});
  EXPECT_EQ(rank.sizing.micro_batches().sizes(), (std::vector<std::int64_t>{16, 16}));
  EXPECT_FALSE(rank.sizing.take_memory_probe());  // no limit: nothing to predict against
  const Sizing::OutOfMemory lowered = rank.sizing.after_out_of_memory(rank_one_ran_out(), 3);
  EXPECT_FALSE(lowered.failure);
  EXPECT_EQ(lowered.event.step, 3);
  EXPECT_EQ(lowered.event.ranks, (std::vector<int>{1}));
  EXPECT_EQ(lowered.event.ranks_text, "rank 1");
  EXPECT_EQ(lowered.event.where_text, " in backward");
  EXPECT_EQ(lowered.event.micro_batches, (std::vector<std::int64_t>{16}));
  EXPECT_EQ(lowered.event.next, (std::vector<std::int64_t>{8}));
  // Scope global: every rank runs the smaller size.
  EXPECT_EQ(rank.sizing.micro_batches().sizes(), (std::vector<std::int64_t>{8, 8}));
}

TEST_F(SizingTest, AFixedSizeThatRunsOutEndsTheRunInOneLine) {
  TrainOptions o = options();
  o.micro_batch = 4;
  Rank rank(o, 2, 0);
  rank.sizing.start({});
  const Sizing::OutOfMemory lowered = rank.sizing.after_out_of_memory(rank_one_ran_out(), 3);
  ASSERT_TRUE(lowered.failure);
  EXPECT_TRUE(lowered.event.next.empty());
  EXPECT_NE(lowered.failure->find("rank 1 ran out of memory at micro-batch 4 in backward"),
            std::string::npos)
      << *lowered.failure;
  EXPECT_NE(lowered.failure->find(
                "at step 3: --micro-batch 4 is fixed; use --micro-batch auto to let autoaccum "
                "find a size that fits"),
            std::string::npos)
      << *lowered.failure;
}

TEST_F(SizingTest, TheMemoryProbeRunsOnceWithALimitAndNotOnResume) {
  const TrainOptions o = options();
  const std::int64_t limit = 64 << 20;
  Rank rank(o, 2, limit);
  rank.sizing.start({});
  const auto setup = rank.sizing.take_memory_probe();
  ASSERT_TRUE(setup);
  EXPECT_EQ(setup->low, 2);  // BatchNorm cannot train on one row
  EXPECT_EQ(setup->size_cap, 16);
  EXPECT_EQ(setup->limits, (std::vector<std::int64_t>{limit, limit}));
  EXPECT_FALSE(rank.sizing.take_memory_probe());
  rank.sizing.start({8, 8});  // a checkpoint's sizes: the run continues at them
  EXPECT_FALSE(rank.sizing.take_memory_probe());
  EXPECT_EQ(rank.sizing.micro_batches().sizes(), (std::vector<std::int64_t>{8, 8}));
}

TEST_F(SizingTest, ACheckpointsSizesContinueOnTheSameRanksAndTheLargestOnOthers) {
  TrainOptions o = options();
  o.micro_batch_per_rank = true;
  io::Checkpoint c;
  {
    Rank two(o, 2, 0);
    two.sizing.start({});
    (void)two.sizing.after_out_of_memory(rank_one_ran_out(), 3);
    EXPECT_EQ(two.sizing.micro_batches().sizes(), (std::vector<std::int64_t>{16, 8}));
    two.sizing.record(c);
    c.world_size = 2;
  }
  EXPECT_EQ(c.micro_batches, (std::vector<std::int64_t>{16, 8}));
  EXPECT_EQ(c.memory_models.size(), 2u);

  Rank again(o, 2, 0);
  std::string note;
  EXPECT_EQ(again.sizing.restore_sizes(c, note), (std::vector<std::int64_t>{16, 8}));
  EXPECT_EQ(note, "");
  EXPECT_EQ(again.sizing.micro_batches().sizes(), (std::vector<std::int64_t>{16, 8}));

  // Three ranks: per-rank sizes belong to ranks that may not exist; every rank starts from the
  // largest, capped by the new share (ceil(32 / 3) = 11).
  Rank three(o, 3, 0);
  EXPECT_EQ(three.sizing.restore_sizes(c, note), (std::vector<std::int64_t>{16}));
  EXPECT_EQ(note,
            "the checkpoint was written by 2 rank(s); now 3: per-rank micro-batches (16, 8) do "
            "not map onto other ranks: every rank starts at 16 and halves where it runs out of "
            "memory (capped at the new per-rank batch, 11)");
  EXPECT_EQ(three.sizing.micro_batches().sizes(), (std::vector<std::int64_t>{11, 11, 11}));
}

}  // namespace
}  // namespace autoaccum::train
