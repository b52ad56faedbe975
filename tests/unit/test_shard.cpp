// --shard optimizer's pieces without MPI: which rank owns which elements, the bytes each rank
// holds, and every gradient a view of the one flat buffer, a parameter crossing a slice boundary
// included.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "autoaccum/comm/local_communicator.hpp"
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
  const FixedBytes whole = replicated_fixed_bytes(p, 0, 2);
  EXPECT_EQ(whole.total(), 16 * p);
  const ShardLayout l = shard_layout(4, p, 0);
  const FixedBytes sliced = sharded_fixed_bytes(l, 1, 2);
  EXPECT_EQ(sliced.parameters, 4 * p);
  EXPECT_EQ(sliced.gradients, 4 * p);
  EXPECT_EQ(sliced.optimizer, 8 * p / 4);
  EXPECT_DOUBLE_EQ(static_cast<double>(sliced.total()) / static_cast<double>(whole.total()), 0.625);
  // One tail after the gradients; parameters and gradients padded to W slices.
  EXPECT_EQ(sharded_fixed_bytes(shard_layout(4, p, 100), 0, 2).gradients, 4 * (p + 100));
  EXPECT_EQ(sharded_fixed_bytes(shard_layout(4, p + 1, 0), 0, 2).parameters, 4 * (p + 4));
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

}  // namespace
}  // namespace autoaccum::train
