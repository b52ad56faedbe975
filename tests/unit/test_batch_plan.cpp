// BatchPlan: rank parts, epochs and shuffling, checked by brute force over many sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "autoaccum/core/error.hpp"
#include "autoaccum/data/batch_plan.hpp"

namespace autoaccum::data {
namespace {

TEST(BatchPlan, RankPartsAreDisjointContiguousCoverTheBatchAndDifferByAtMostOne) {
  for (std::int64_t batch = 1; batch <= 130; ++batch) {
    for (int world = 1; world <= std::min<std::int64_t>(batch, 9); ++world) {
      std::int64_t expected_begin = 0;
      std::int64_t smallest = batch, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        const RowRange part = BatchPlan::rank_part(batch, world, rank);
        ASSERT_EQ(part.begin, expected_begin) << "B=" << batch << " W=" << world << " r=" << rank;
        ASSERT_GE(part.size(), 1);
        smallest = std::min(smallest, part.size());
        largest = std::max(largest, part.size());
        expected_begin = part.end;
      }
      EXPECT_EQ(expected_begin, batch) << "B=" << batch << " W=" << world;
      EXPECT_LE(largest - smallest, 1) << "B=" << batch << " W=" << world;
    }
  }
}

TEST(BatchPlan, RankRowsLieInsideTheirBatch) {
  BatchPlan plan(1000, 77, 4, Shuffle::kBatch, 5);
  for (std::int64_t step = 0; step < plan.batches_per_epoch(); ++step) {
    const RowRange batch = plan.batch_rows(3, step);
    EXPECT_EQ(batch.size(), 77);
    EXPECT_EQ(plan.rank_rows(3, step, 0).begin, batch.begin);
    EXPECT_EQ(plan.rank_rows(3, step, 3).end, batch.end);
    EXPECT_EQ(plan.max_rank_rows(), 20);
  }
}

TEST(BatchPlan, AnEpochCoversEachCompleteBatchOnceAndDropsTheRest) {
  BatchPlan plan(1003, 100, 3, Shuffle::kBatch, 42);
  ASSERT_EQ(plan.batches_per_epoch(), 10);
  for (std::int64_t epoch = 0; epoch < 4; ++epoch) {
    std::set<std::int64_t> firsts;
    for (std::int64_t step = 0; step < 10; ++step) {
      const RowRange rows = plan.batch_rows(epoch, step);
      EXPECT_EQ(rows.begin % 100, 0);
      EXPECT_LE(rows.end, 1000);  // rows 1000..1002 form no complete batch
      firsts.insert(rows.begin);
    }
    EXPECT_EQ(firsts.size(), 10u);
  }
}

TEST(BatchPlan, NoShuffleKeepsFileOrder) {
  BatchPlan plan(500, 50, 2, Shuffle::kNone, 7);
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    for (std::int64_t step = 0; step < 10; ++step) {
      EXPECT_EQ(plan.batch_rows(epoch, step), (RowRange{step * 50, step * 50 + 50}));
    }
  }
}

std::vector<std::int64_t> order_of(const BatchPlan& plan, std::int64_t epoch) {
  std::vector<std::int64_t> order;
  for (std::int64_t s = 0; s < plan.batches_per_epoch(); ++s)
    order.push_back(plan.batch_index(epoch, s));
  return order;
}

TEST(BatchPlan, SameSeedSameOrderNextEpochNewOrder) {
  BatchPlan a(64 * 50, 64, 4, Shuffle::kBatch, 1234);
  BatchPlan b(64 * 50, 64, 4, Shuffle::kBatch, 1234);
  BatchPlan c(64 * 50, 64, 4, Shuffle::kBatch, 1235);
  EXPECT_EQ(order_of(a, 0), order_of(b, 0));
  EXPECT_EQ(order_of(a, 5), order_of(b, 5));
  EXPECT_NE(order_of(a, 0), order_of(a, 1));
  EXPECT_NE(order_of(a, 0), order_of(c, 0));
  // Asking for epochs out of order gives the same answers (a resumed run starts mid-way).
  const auto epoch3 = order_of(a, 3);
  order_of(a, 0);
  EXPECT_EQ(order_of(a, 3), epoch3);
  // Shuffled, not the identity.
  std::vector<std::int64_t> identity(50);
  for (int i = 0; i < 50; ++i)
    identity[static_cast<std::size_t>(i)] = i;
  EXPECT_NE(order_of(a, 0), identity);
}

TEST(BatchPlan, PermutationIsAPermutation) {
  for (std::int64_t n : {0, 1, 2, 17, 1000}) {
    auto p = permutation(n, 99);
    std::sort(p.begin(), p.end());
    for (std::int64_t i = 0; i < n; ++i)
      EXPECT_EQ(p[static_cast<std::size_t>(i)], i);
  }
}

TEST(BatchPlan, BadSizesAreUsageErrorsNamingTheOption) {
  auto message = [](auto make) {
    try {
      make();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { BatchPlan(100, 0, 1, Shuffle::kNone, 0); }).find("--global-batch"),
            std::string::npos);
  EXPECT_NE(message([] {
              BatchPlan(100, 101, 1, Shuffle::kNone, 0);
            }).find("larger than the training data (100 rows)"),
            std::string::npos);
  EXPECT_NE(message([] { BatchPlan(100, 3, 4, Shuffle::kNone, 0); }).find("4 ranks"),
            std::string::npos);
  EXPECT_THROW(BatchPlan(0, 1, 1, Shuffle::kNone, 0), InputError);
  EXPECT_THROW(parse_shuffle("random"), UsageError);
  EXPECT_EQ(parse_shuffle("none"), Shuffle::kNone);
  EXPECT_EQ(parse_shuffle("batch"), Shuffle::kBatch);
}

}  // namespace
}  // namespace autoaccum::data
