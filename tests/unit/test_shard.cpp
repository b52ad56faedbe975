// --shard optimizer's and gradients' pieces without MPI: which rank owns which elements, the
// bytes each rank holds, every gradient a view of the one flat buffer (a parameter crossing a
// slice boundary included), and the gradients level's reduces: every bucket of every micro-batch
// any rank runs, in order, whatever happened to this rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <utility>
#include <vector>

#include "autoaccum/comm/local_communicator.hpp"
#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reducer.hpp"
#include "test_comm.hpp"

namespace autoaccum::train {
namespace {

TEST(ShardLayout, SlicesCoverEveryElementOnceAndTheLastMayBeShortOrEmpty) {
  for (int world : {1, 2, 3, 4, 7}) {
    for (std::int64_t elements : {0, 1, 5, 10, 1001}) {
      const ShardLayout l = shard_layout(world, elements, 12);
      std::int64_t covered = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(l.begin(r), covered) << world << " " << elements;
        EXPECT_GE(l.end(r), l.begin(r));
        EXPECT_LE(l.end(r) - l.begin(r), l.slice);
        covered = l.end(r);
      }
      EXPECT_EQ(covered, elements);
      EXPECT_GE(l.slice * world, elements);
      EXPECT_LT(l.slice * world, elements + world);
    }
  }
}

TEST(FixedBytes, AdamWHoldsSixteenBytesAParameterUnshardedAndFourPlusFourPlusEightOverW) {
  const std::int64_t p = 1 << 20;
  const std::int64_t largest = 1000, staging = 300;
  const FixedBytes whole =
      fixed_bytes(ShardLevel::kNone, shard_layout(4, p, 0), 1, 2, largest, staging);
  EXPECT_EQ(whole.total(), 16 * p);
  const ShardLayout l = shard_layout(4, p, 0);
  const FixedBytes sliced = fixed_bytes(ShardLevel::kOptimizer, l, 1, 2, largest, staging);
  EXPECT_EQ(sliced.parameters, 4 * p);
  EXPECT_EQ(sliced.gradients, 4 * p);
  EXPECT_EQ(sliced.optimizer, 8 * p / 4);
  EXPECT_EQ(sliced.transient, 0);
  EXPECT_DOUBLE_EQ(static_cast<double>(sliced.total()) / static_cast<double>(whole.total()), 0.625);
  // Gradients sliced too: 4 + 4/W + 8/W bytes a parameter (0.4375), plus the staging bucket and
  // the largest gradient as backward makes it.
  const FixedBytes both = fixed_bytes(ShardLevel::kGradients, l, 1, 2, largest, staging);
  EXPECT_EQ(both.gradients, 4 * (p / 4 + staging));
  EXPECT_EQ(both.transient, 4 * largest);
  EXPECT_DOUBLE_EQ(static_cast<double>(both.total() - both.transient - 4 * staging) /
                       static_cast<double>(whole.total()),
                   0.4375);
  // One tail after the gradients; parameters and gradients padded to W slices.
  EXPECT_EQ(fixed_bytes(ShardLevel::kOptimizer, shard_layout(4, p, 100), 0, 2, 0, 0).gradients,
            4 * (p + 100));
  EXPECT_EQ(fixed_bytes(ShardLevel::kOptimizer, shard_layout(4, p + 1, 0), 0, 2, 0, 0).parameters,
            4 * (p + 4));
  // One rank holds everything whatever the level.
  EXPECT_EQ(fixed_bytes(ShardLevel::kGradients, shard_layout(1, p, 0), 0, 2, 0, 0).total(), 16 * p);
}

TEST(ShardedReduce, OneRankStepsEverythingLastParameterFirstWithTheTailAfterTheGradients) {
  // One rank: the flat space is [b | a] (reverse order), then the tail; the parameters keep
  // their values as views of the flat buffer, and gradients() is everything.
  comm::LocalCommunicator one;
  torch::manual_seed(3);
  auto a = torch::randn({3, 4}).set_requires_grad(true);
  auto b = torch::randn({5}).set_requires_grad(true);
  const at::Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
  auto reducer = sharded_reducer(one, one, {a, b}, 2, 3, c10::Device(c10::kCPU));
  EXPECT_TRUE(torch::equal(a.detach(), a0));
  EXPECT_TRUE(torch::equal(b.detach(), b0));
  ASSERT_NE(reducer->shards(), nullptr);
  EXPECT_EQ(reducer->shards()->offsets, (std::vector<std::int64_t>{5, 0}));
  reducer->begin();
  reducer->part(Reducer::Part::kControl).fill_(7);
  ((a * a).sum() + (b * 3).sum()).backward();
  EXPECT_TRUE(reducer->gradients_intact());
  reducer->reduce();
  const at::Tensor g = reducer->gradients();
  ASSERT_EQ(g.numel(), 17);
  EXPECT_TRUE(torch::allclose(g.narrow(0, 0, 5), torch::full({5}, 3.0f)));
  EXPECT_TRUE(torch::allclose(g.narrow(0, 5, 12), (2 * a0).reshape(-1)));
  EXPECT_TRUE(torch::equal(reducer->part(Reducer::Part::kControl), torch::full({3}, 7.0f)));
  ASSERT_EQ(reducer->stepped().size(), 1u);
  EXPECT_EQ(reducer->stepped()[0].numel(), 17);
  EXPECT_EQ(reducer->total(2.5), 2.5);
}

TEST(ShardedReduce, AParameterCrossingASliceBoundaryKeepsOneGradientViewAcrossBothSlices) {
  // 12 + 5 elements on 2 ranks: slices of 9 over [b (0-4) | a (5-16)]. `a` crosses (its
  // elements 0-3 in slice 0, 4-11 in slice 1), yet its gradient is one view of the buffer that
  // backward accumulates into: no gradient exists outside it. Rank 1 steps a's last 8 elements.
  test::TestComm comm(1, 2);  // rank 1 of 2; the peer contributes zeros
  torch::manual_seed(4);
  auto a = torch::randn({3, 4}).set_requires_grad(true);
  auto b = torch::randn({5}).set_requires_grad(true);
  const at::Tensor a0 = a.detach().clone();
  auto reducer = sharded_reducer(comm, comm, {a, b}, 1, 2, c10::Device(c10::kCPU));
  const void* bound = nullptr;
  for (int attempt = 0; attempt < 2; ++attempt) {  // each: two backward passes accumulate
    reducer->begin();
    for (int k = 0; k < 2; ++k)
      ((a * a).sum() + (b * 3).sum()).backward();
    ASSERT_TRUE(a.grad().defined());
    if (bound == nullptr) bound = a.grad().data_ptr();
    EXPECT_EQ(a.grad().data_ptr(), bound) << "the same view, accumulated in place";
    EXPECT_TRUE(reducer->gradients_intact());
    reducer->part(Reducer::Part::kControl).fill_(5);
    reducer->reduce();
  }
  EXPECT_TRUE(torch::allclose(reducer->gradients(), (4 * a0).reshape(-1).narrow(0, 4, 8)))
      << reducer->gradients();
  EXPECT_TRUE(torch::equal(reducer->part(Reducer::Part::kControl), torch::full({2}, 5.0f)));
  EXPECT_EQ(reducer->stepped()[0].numel(), 8);
}

TEST(SlicedGradients, BucketsHoldWholeParametersAndALargeOneGoesAlone) {
  // Buckets of 10 floats: 3 + 4 + 5 close at 12; 30 goes alone (closing [2] before it); 1 + 9
  // close at 10; the trailing empty parameter joins the last bucket.
  const std::vector<std::int64_t> sizes{3, 4, 5, 2, 30, 1, 9, 6, 0};
  const std::vector<Bucket> b = gradient_buckets(sizes, 40);
  const std::vector<std::pair<std::size_t, std::size_t>> want{
      {0, 3}, {3, 4}, {4, 5}, {5, 7}, {7, 9}};
  ASSERT_EQ(b.size(), want.size());
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    EXPECT_EQ(std::make_pair(b[k].first, b[k].last), want[k]) << k;
    EXPECT_EQ(b[k].offset, offset) << k;
    for (std::size_t i = b[k].first; i < b[k].last; ++i)
      offset += sizes[i];
    EXPECT_EQ(b[k].offset + b[k].count, offset) << k;
  }
  // Staged: the largest bucket of more than one parameter (12), never the 30 that goes alone.
  EXPECT_EQ(gradient_staging_floats(sizes, 40), 12);
  EXPECT_TRUE(gradient_buckets({}, 40).empty());
}

// Rank `rank` of `size` whose peers contribute zeros, and one of which runs `others` micro-batches
// in the attempt; records every reduce (its floats, root and sum).
class RecordingComm : public test::TestComm {
 public:
  RecordingComm(int rank, int size, std::int64_t others) : TestComm(rank, size), others_(others) {}
  void allreduce_max(std::int64_t* values, std::size_t count) override {
    for (std::size_t i = 0; i < count; ++i)
      values[i] = std::max(values[i], others_);
  }
  struct Call {
    std::size_t count;
    int root;
    double sum;
  };
  std::vector<Call> calls;

 protected:
  void do_reduce_sum(float* data, std::size_t count, int root, const char*) override {
    double sum = 0;
    for (std::size_t i = 0; i < count; ++i)
      sum += data[i];
    calls.push_back({count, root, sum});
  }

 private:
  std::int64_t others_;
};

TEST(SlicedGradients, EveryMicroBatchReducesEveryBucketToItsOwnersAndNoGradientOutlivesIt) {
  // [b (5) | a (12)] on 2 ranks: slices of 9; buckets of 8 bytes (2 floats) cut [b] [a], each
  // one parameter; `a` crosses the boundary, so it goes as two reduces (4 floats to rank 0, 8 to
  // rank 1). Rank 1 runs 2 micro-batches, another rank 3: a third round of zeros follows.
  RecordingComm comm(1, 2, 3);
  torch::manual_seed(4);
  auto a = torch::randn({3, 4}).set_requires_grad(true);
  auto b = torch::randn({5}).set_requires_grad(true);
  const at::Tensor a0 = a.detach().clone();
  auto reducer = gradient_sharded_reducer(comm, comm, {a, b}, 1, 2, 8, c10::Device(c10::kCPU));
  EXPECT_EQ(reducer->shards()->offsets, (std::vector<std::int64_t>{5, 0}));
  reducer->begin();
  reducer->expect_micro_batches(2);
  for (int k = 0; k < 2; ++k) {
    const at::Tensor loss = (a * a).sum() * (k + 1) + (b * 3).sum();
    reducer->before_backward(loss, k == 1);
    loss.backward();
    EXPECT_EQ(comm.calls.size(), 3u * (k + 1)) << "sent from backward's hooks";
    reducer->after_backward();
    EXPECT_FALSE(a.grad().defined());
    EXPECT_TRUE(reducer->gradients_intact());
  }
  reducer->part(Reducer::Part::kControl).fill_(5);
  reducer->reduce();
  // Rank 1 owns a's last 8 elements: 2a + 4a, summed over its two micro-batches.
  EXPECT_TRUE(torch::allclose(reducer->gradients(), (6 * a0).reshape(-1).narrow(0, 4, 8)));
  EXPECT_TRUE(torch::equal(reducer->part(Reducer::Part::kControl), torch::full({2}, 5.0f)));
  const std::vector<std::pair<std::size_t, int>> round{{5, 0}, {4, 0}, {8, 1}};
  ASSERT_EQ(comm.calls.size(), 3 * round.size());
  for (std::size_t i = 0; i < comm.calls.size(); ++i) {
    EXPECT_EQ(comm.calls[i].count, round[i % 3].first) << i;
    EXPECT_EQ(comm.calls[i].root, round[i % 3].second) << i;
  }
  EXPECT_EQ(comm.calls[0].sum, 15.0);  // b's gradient, 3 each
  for (std::size_t i = 6; i < 9; ++i)
    EXPECT_EQ(comm.calls[i].sum, 0.0) << "the round this rank has no micro-batch for";
}

TEST(SlicedGradients, AnAttemptThatFailsInBackwardSendsItsRoundsAndTheNextCountsAlone) {
  // Buckets of 4 floats: [b (5)] [a (12)]; another rank runs 2 micro-batches. Rank 0 fails in
  // its first micro-batch's backward; reduce() sends what is left of that round (zeros for a,
  // whose gradient was never made) and a whole round of zeros, and the next attempt starts from
  // zero.
  RecordingComm comm(0, 2, 2);
  auto a = torch::ones({3, 4}).set_requires_grad(true);
  auto b = torch::ones({5}).set_requires_grad(true);
  auto reducer = gradient_sharded_reducer(comm, comm, {a, b}, 0, 1, 16, c10::Device(c10::kCPU));
  reducer->begin();
  reducer->expect_micro_batches(1);
  // a's gradient passes through a hook that throws, as an out-of-memory in backward would.
  auto failing = a.register_hook([](const at::Tensor&) -> at::Tensor {
    throw std::runtime_error("out of memory in backward");
  });
  const at::Tensor loss = (a * 2).sum() + (b * 3).sum();
  reducer->before_backward(loss, true);
  EXPECT_THROW(loss.backward(), std::runtime_error);
  a.remove_hook(failing);
  reducer->reduce();
  ASSERT_EQ(comm.calls.size(), 6u);  // two rounds of [b to 0] [a: 4 to 0, 8 to 1]
  // b's gradient (3 each) went if autograd made it before a's failed (its order decides).
  EXPECT_TRUE(comm.calls[0].sum == 15.0 || comm.calls[0].sum == 0.0) << comm.calls[0].sum;
  for (std::size_t i = 1; i < 6; ++i)
    EXPECT_EQ(comm.calls[i].sum, 0.0) << i;
  EXPECT_FALSE(b.grad().defined());
  reducer->begin();
  reducer->expect_micro_batches(1);
  const at::Tensor again = (a * 2).sum() + (b * 3).sum();
  reducer->before_backward(again, true);
  again.backward();
  reducer->after_backward();
  reducer->reduce();
  // Rank 0 owns b (3 each) and a's first 4 elements (2 each), this attempt's only.
  EXPECT_TRUE(torch::equal(reducer->gradients(),
                           torch::cat({torch::full({5}, 3.0f), torch::full({4}, 2.0f)})));
}

}  // namespace
}  // namespace autoaccum::train
