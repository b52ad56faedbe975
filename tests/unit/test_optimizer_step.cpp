// OptimizerStep's update in pieces: the same bits as LibTorch's own SGD and AdamW steps over the
// whole tensors, with temporaries bounded by a piece (measured by the CPU budget's counters)
// where LibTorch's are the size of the largest parameter.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"

namespace autoaccum::train {
namespace {

// Parameters of several shapes: small, one piece exactly (2^20), and more than two pieces
// with a remainder; their gradients are views of one flat buffer, as the step's are.
struct Params {
  std::vector<at::Tensor> tensors;
  at::Tensor gradients;

  explicit Params(std::uint64_t seed) {
    torch::manual_seed(seed);
    const std::vector<std::vector<std::int64_t>> shapes{{3, 5}, {1024, 1024}, {(2 << 20) + 123}};
    std::int64_t total = 0;
    for (const auto& shape : shapes) {
      tensors.push_back(torch::randn(shape).requires_grad_(true));
      total += tensors.back().numel();
    }
    gradients = torch::zeros({total});
    std::int64_t offset = 0;
    for (auto& p : tensors) {
      p.mutable_grad() = gradients.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
    }
  }
  std::vector<at::Tensor> clones() const {
    std::vector<at::Tensor> out;
    for (const auto& p : tensors) {
      out.push_back(p.detach().clone().requires_grad_(true));
      out.back().mutable_grad() = torch::zeros_like(p);
    }
    return out;
  }
};

std::unique_ptr<torch::optim::Optimizer> libtorch_optimizer(const TrainOptions& o,
                                                            const std::vector<at::Tensor>& params) {
  if (o.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
}

struct Case {
  std::string optimizer;
  double momentum, weight_decay;
};

class OptimizerInPieces : public testing::TestWithParam<Case> {};

TEST_P(OptimizerInPieces, EqualsLibTorchBitForBitWithTemporariesBoundedByAPiece) {
  memory::install_cpu_budget(0);  // no limit: counts live bytes and their peak
  TrainOptions o;
  o.optimizer = GetParam().optimizer;
  o.momentum = GetParam().momentum;
  o.weight_decay = GetParam().weight_decay;
  o.lr = 0.01;
  Params ours(7);
  std::vector<at::Tensor> theirs = ours.clones();
  OptimizerStep step(o, ours.tensors);
  auto reference = libtorch_optimizer(o, theirs);

  std::int64_t our_extra = 0, their_extra = 0;
  for (int s = 0; s < 3; ++s) {
    const double lr = 0.01 * (s + 1);
    ours.gradients.copy_(torch::randn(ours.gradients.sizes()));
    std::int64_t offset = 0;
    for (auto& p : theirs) {
      p.mutable_grad().copy_(ours.gradients.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
    std::int64_t live = memory::cpu_live_bytes();
    memory::reset_cpu_peak();
    ASSERT_EQ(step.apply(ours.gradients, 1.0, lr), OptimizerStep::Result::kStepped);
    our_extra = std::max(our_extra, memory::cpu_peak_bytes() - live);

    for (auto& group : reference->param_groups())
      group.options().set_lr(lr);
    live = memory::cpu_live_bytes();
    memory::reset_cpu_peak();
    reference->step();
    // LibTorch allocates its state at the first step; its temporaries are what comes after.
    if (s > 0) their_extra = std::max(their_extra, memory::cpu_peak_bytes() - live);

    for (std::size_t i = 0; i < theirs.size(); ++i)
      ASSERT_TRUE(torch::equal(ours.tensors[i], theirs[i])) << "step " << s << " tensor " << i;
  }
  // A piece is 2^20 float32 elements; SGD without weight decay makes no temporary.
  const bool temporaries = o.optimizer == "adamw" || o.weight_decay != 0;
  const std::int64_t piece = std::int64_t{4} << 20;
  EXPECT_EQ(step.temporary_bytes(), temporaries ? piece : 0);
  EXPECT_LE(our_extra, step.temporary_bytes() + 4096) << "LibTorch's step took " << their_extra;
  // Where LibTorch makes a temporary, it is the size of the largest parameter (> 2 pieces).
  if (temporaries) {
    EXPECT_GT(their_extra, 2 * piece);
  }
}

INSTANTIATE_TEST_SUITE_P(SgdAndAdamW, OptimizerInPieces,
                         testing::Values(Case{"sgd", 0, 0}, Case{"sgd", 0.9, 0},
                                         Case{"sgd", 0.9, 0.01}, Case{"adamw", 0, 0},
                                         Case{"adamw", 0, 0.01}),
                         [](const testing::TestParamInfo<Case>& c) {
                           return c.param.optimizer + (c.param.momentum ? "Momentum" : "") +
                                  (c.param.weight_decay ? "Decay" : "");
                         });

}  // namespace
}  // namespace autoaccum::train
