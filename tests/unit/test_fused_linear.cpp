// accumulating_linear against LibTorch's own linear layer under autograd.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "autoaccum/train/model/fused_linear.hpp"

namespace autoaccum::train {
namespace {

struct Pair {
  at::Tensor weight, bias;
};

Pair make_parameters() {
  torch::manual_seed(3);
  return {torch::randn({7, 5}).requires_grad_(), torch::randn({7}).requires_grad_()};
}

// Three micro-batches accumulated, with the gradients pre-existing as views into one buffer
// (as FlatGradients sets them up) or undefined (autograd creates them).
void accumulate(const Pair& p, bool fused, bool preset, const at::Tensor& x, at::Tensor& flat) {
  if (preset) {
    flat = torch::zeros({7 * 5 + 7});
    p.weight.mutable_grad() = flat.narrow(0, 0, 35).view({7, 5});
    p.bias.mutable_grad() = flat.narrow(0, 35, 7);
  }
  for (int k = 0; k < 3; ++k) {
    const at::Tensor micro = x.narrow(0, k * 4, 4).clone().requires_grad_();
    const at::Tensor y = fused ? accumulating_linear(micro, p.weight, p.bias)
                               : torch::nn::functional::linear(micro, p.weight, p.bias);
    (y.tanh() * (k + 1)).sum().backward();
  }
}

TEST(AccumulatingLinear, ForwardAndAccumulatedGradientsMatchLibTorch) {
  torch::manual_seed(1);
  const at::Tensor x = torch::randn({12, 5});
  for (bool preset : {true, false}) {
    Pair reference = make_parameters(), fused = make_parameters();
    at::Tensor flat_reference, flat_fused;
    accumulate(reference, false, preset, x, flat_reference);
    accumulate(fused, true, preset, x, flat_fused);
    EXPECT_TRUE(torch::allclose(fused.weight.grad(), reference.weight.grad(), 1e-5, 1e-6))
        << "preset " << preset;
    EXPECT_TRUE(torch::allclose(fused.bias.grad(), reference.bias.grad(), 1e-5, 1e-6));
    EXPECT_GT(fused.weight.grad().abs().sum().item<double>(), 0);
    if (preset) {
      // Accumulated in place: still the views into the flat buffer.
      EXPECT_EQ(fused.weight.grad().data_ptr(), flat_fused.data_ptr());
      EXPECT_TRUE(torch::allclose(flat_fused, flat_reference, 1e-5, 1e-6));
    }
  }
  // Forward values and the input gradient.
  Pair p = make_parameters();
  const at::Tensor a = x.clone().requires_grad_(), b = x.clone().requires_grad_();
  const at::Tensor ya = accumulating_linear(a, p.weight, p.bias);
  const at::Tensor yb = torch::nn::functional::linear(b, p.weight, p.bias);
  EXPECT_TRUE(torch::allclose(ya, yb, 1e-6, 1e-6));
  ya.pow(2).sum().backward();
  yb.pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(a.grad(), b.grad(), 1e-5, 1e-6));
}

TEST(AccumulatingLinear, FrozenParametersGetNoGradient) {
  Pair p = make_parameters();
  p.weight.requires_grad_(false);
  const at::Tensor x = torch::randn({3, 5}, torch::requires_grad());
  accumulating_linear(x, p.weight, p.bias).sum().backward();
  EXPECT_FALSE(p.weight.grad().defined());
  EXPECT_TRUE(p.bias.grad().defined());
  EXPECT_TRUE(torch::allclose(p.bias.grad(), torch::full({7}, 3.0)));
}

}  // namespace
}  // namespace autoaccum::train
