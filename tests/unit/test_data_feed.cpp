// DataFeed alone: each step's rows and every rank's part of them against the rule written out
// here (docs/data-format.md), epochs counted from a checkpoint's epoch start, the size bounds,
// shares changed by Balance, and bad --val-data named.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/sizing/data_feed.hpp"
#include "test_rows_file.hpp"

namespace autoaccum::train {
namespace {

class DataFeedTest : public testing::Test {
 protected:
  std::string dir = testing::TempDir() + "/autoaccum_feed_" + std::to_string(::getpid());
  void SetUp() override { ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0); }
  void TearDown() override { (void)system(("rm -rf " + dir).c_str()); }

  std::string write_rows(const std::string& name, std::int64_t rows, std::int64_t classes,
                         std::int64_t largest_label) {
    return test::write_rows(dir + "/" + name, rows, classes, largest_label);
  }

  TrainOptions options_for(const std::string& data) {
    TrainOptions o;
    o.data = {data};
    o.global_batch = 30;
    o.epochs = 2;
    o.shuffle = "none";
    return o;
  }
};

// Rank r of W takes rows [floor(r B / W), floor((r + 1) B / W)) of its batch; with --shuffle
// none batch s of an epoch is rows [s B, (s + 1) B).
TEST_F(DataFeedTest, EachStepsRowsAreThisRanksPartOfItsBatch) {
  TrainOptions o = options_for(write_rows("a.h5", 100, 5, 4));
  o.micro_batch = 4;
  const int world = 4, rank = 2;
  DataFeed feed(o, rank, world);
  feed.expand_paths();
  feed.open(/*root=*/false);
  EXPECT_FALSE(feed.documents());
  EXPECT_EQ(feed.plan().batches_per_epoch(), 3);  // 100 rows: 3 batches of 30, 10 dropped
  EXPECT_EQ(feed.total_steps(), 6);               // --epochs 2
  const std::int64_t B = 30;
  for (std::int64_t step = 0; step < feed.total_steps(); ++step) {
    const std::int64_t batch_start = (step % 3) * B;
    const StepSplit split = feed.split_of(step);
    EXPECT_EQ(split.batch.begin, batch_start);
    EXPECT_EQ(split.batch.end, batch_start + B);
    ASSERT_EQ(split.rows.size(), 4u);
    for (int r = 0; r < world; ++r)
      EXPECT_EQ(split.rows[static_cast<std::size_t>(r)], (r + 1) * B / world - r * B / world);
    EXPECT_TRUE(split.tokens.empty());
    const data::Batch slab = feed.read_rank_rows(step);
    const std::int64_t first = batch_start + rank * B / world;
    const std::int64_t end = batch_start + (rank + 1) * B / world;
    ASSERT_EQ(slab.rows(), end - first);
    EXPECT_TRUE(
        torch::equal(slab.get("x").select(1, 0), torch::arange(first, end, torch::kFloat32)))
        << "step " << step;
  }
  EXPECT_EQ(feed.sizes().cap, 8);  // the largest part: ceil(30 / 4)
  EXPECT_EQ(feed.sizes().floor, 1);
  EXPECT_EQ(feed.sizes().fixed, std::optional<std::int64_t>(4));
  EXPECT_EQ(feed.count_text(1), "1 row");
  EXPECT_EQ(feed.count_text(64), "64 rows");
  EXPECT_EQ(feed.cut_text(), "");
}

TEST_F(DataFeedTest, ChangedSharesSplitTheStepsTheyStartFrom) {
  TrainOptions o = options_for(write_rows("a.h5", 100, 5, 4));
  o.balance = true;
  o.balance_every = 1;
  DataFeed feed(o, 0, 4);
  feed.expand_paths();
  feed.open(false);
  const std::vector<std::int64_t> even = feed.split_of(1).rows;
  ASSERT_TRUE(feed.balance().restore(2, {10, 5, 10, 5}, {12, 3, 12, 3}, {}));
  EXPECT_EQ(feed.split_of(1).rows, even);
  EXPECT_EQ(feed.split_of(2).rows, (std::vector<std::int64_t>{10, 5, 10, 5}));
  EXPECT_EQ(feed.split_of(3).rows, (std::vector<std::int64_t>{12, 3, 12, 3}));
  EXPECT_EQ(feed.split_of(3).offsets, (std::vector<std::int64_t>{0, 12, 15, 27, 30}));
  EXPECT_EQ(feed.read_rank_rows(3).rows(), 12);
}

// A checkpoint's epoch 1 began at step 5 (a reshaped run's start is no multiple of the batches
// per epoch): step 7 is its batch 2, the next epoch starts 3 batches later, and --epochs 3
// ends two epochs after it began.
TEST_F(DataFeedTest, ResumedEpochsCountFromTheCheckpointsEpochStart) {
  TrainOptions o = options_for(write_rows("a.h5", 100, 5, 4));
  o.epochs = 3;
  DataFeed feed(o, 0, 2);
  feed.expand_paths();
  feed.open(false);
  EXPECT_EQ(feed.total_steps(), 9);
  feed.resume_at(/*step=*/7, /*epoch_step=*/5, /*epoch=*/1);
  EXPECT_EQ(feed.position(7).epoch, 1);
  EXPECT_EQ(feed.position(7).batch, 2);
  EXPECT_EQ(feed.position(8).epoch, 2);
  EXPECT_EQ(feed.position(8).batch, 0);
  EXPECT_EQ(feed.total_steps(), 5 + 2 * 3);
  EXPECT_EQ(feed.split_of(8).batch.begin, 0);  // epoch 2's first batch
}

TEST_F(DataFeedTest, AValidationLabelOutsideTheTrainingClassesIsNamed) {
  TrainOptions o = options_for(write_rows("train.h5", 100, 5, 4));
  const std::string val = write_rows("val.h5", 20, 8, 7);
  o.val_data = {val};
  DataFeed feed(o, 0, 2);
  feed.expand_paths();
  try {
    feed.open(false);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "--val-data '" + val +
                                         "': dataset 'y' has label 7, outside the training "
                                         "data's 5 classes [0, 5)");
  }
}

TEST_F(DataFeedTest, RowsRefuseTheOptionsOfDocuments) {
  TrainOptions o = options_for(write_rows("a.h5", 100, 5, 4));
  o.micro_batch_tokens_given = true;
  DataFeed feed(o, 0, 2);
  feed.expand_paths();
  try {
    feed.open(false);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--micro-batch-tokens: --data '" + o.data.front() +
                                         "' holds rows, not documents"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace autoaccum::train
