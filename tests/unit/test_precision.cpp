// --precision: the autocast scope, and the fused linear layer under it against LibTorch's own
// linear under the same autocast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/model/fused_linear.hpp"
#include "autoaccum/train/model/precision.hpp"
#include "autoaccum/train/step/loss_scale.hpp"

namespace autoaccum::train {
namespace {

TEST(Precision, ParsesTheThreeNamesAndRefusesOthersNamingTheOption) {
  EXPECT_EQ(parse_precision("fp32"), Precision::kFp32);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBf16);
  EXPECT_EQ(parse_precision("fp16"), Precision::kFp16);
  try {
    parse_precision("half");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--precision: 'half'"), std::string::npos);
  }
  EXPECT_EQ(precision_problem(Precision::kBf16, c10::Device(c10::kCPU)), "");
  EXPECT_NE(precision_problem(Precision::kFp16, c10::Device(c10::kCPU)).find("--device cuda"),
            std::string::npos);
}

TEST(AutocastScope, TurnsAutocastOnForItsLifeAndRestoresTheStateBefore) {
  ASSERT_FALSE(autocast_enabled(c10::kCPU));
  {
    const AutocastScope fp32(Precision::kFp32, c10::kCPU);
    EXPECT_FALSE(autocast_enabled(c10::kCPU));
  }
  const at::Tensor a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    const AutocastScope outer(Precision::kBf16, c10::kCPU);
    EXPECT_TRUE(autocast_enabled(c10::kCPU));
    EXPECT_EQ(autocast_dtype(c10::kCPU), c10::kBFloat16);
    EXPECT_EQ(a.mm(b).scalar_type(), c10::kBFloat16);  // the product runs in bf16
    {
      const AutocastScope inner(Precision::kBf16, c10::kCPU);
      EXPECT_TRUE(autocast_enabled(c10::kCPU));
    }
    EXPECT_TRUE(autocast_enabled(c10::kCPU));  // the inner scope restored the outer's state
  }
  EXPECT_FALSE(autocast_enabled(c10::kCPU));
  EXPECT_EQ(a.mm(b).scalar_type(), c10::kFloat);
}

// Three micro-batches under bf16 autocast, gradients preset as views into one fp32 buffer.
void accumulate_bf16(const at::Tensor& weight, const at::Tensor& bias, bool fused,
                     const at::Tensor& x, at::Tensor& flat) {
  flat = torch::zeros({7 * 5 + 7});
  weight.mutable_grad() = flat.narrow(0, 0, 35).view({7, 5});
  bias.mutable_grad() = flat.narrow(0, 35, 7);
  for (int k = 0; k < 3; ++k) {
    const at::Tensor micro = x.narrow(0, k * 4, 4).clone().requires_grad_();
    at::Tensor loss;
    {
      const AutocastScope autocast(Precision::kBf16, c10::kCPU);
      const at::Tensor y = fused ? accumulating_linear(micro, weight, bias)
                                 : torch::nn::functional::linear(micro, weight, bias);
      EXPECT_EQ(y.scalar_type(), c10::kBFloat16);
      loss = (y.tanh() * (k + 1)).sum();
    }
    loss.backward();
    EXPECT_EQ(micro.grad().scalar_type(), c10::kFloat);
  }
}

TEST(AccumulatingLinear, UnderBf16AutocastEqualsLibTorchsLinearAndKeepsFp32Gradients) {
  torch::manual_seed(4);
  const at::Tensor x = torch::randn({12, 5});
  const auto parameters = [] {
    torch::manual_seed(3);
    return std::make_pair(torch::randn({7, 5}).requires_grad_(),
                          torch::randn({7}).requires_grad_());
  };
  auto [w_ref, b_ref] = parameters();
  auto [w, b] = parameters();
  at::Tensor flat_ref, flat;
  accumulate_bf16(w_ref, b_ref, false, x, flat_ref);
  accumulate_bf16(w, b, true, x, flat);
  EXPECT_EQ(w.grad().scalar_type(), c10::kFloat);
  EXPECT_EQ(w.grad().data_ptr(), flat.data_ptr());  // still accumulated into the fp32 buffer
  EXPECT_GT(flat.abs().sum().item<double>(), 0);
  EXPECT_TRUE(torch::allclose(flat, flat_ref, 1e-5, 1e-6)) << (flat - flat_ref).abs().max();
  // And they differ from fp32 arithmetic: the check sees the precision.
  auto [w32, b32] = parameters();
  w32.mutable_grad() = torch::zeros({7, 5});
  b32.mutable_grad() = torch::zeros({7});
  for (int k = 0; k < 3; ++k)
    (accumulating_linear(x.narrow(0, k * 4, 4), w32, b32).tanh() * (k + 1)).sum().backward();
  EXPECT_FALSE(torch::allclose(w.grad(), w32.grad(), 1e-5, 1e-6));
}

TEST(Precision, TheBannerLineSaysWhatRunsInWhichPrecisionAndWhatTheProbeFound) {
  EXPECT_EQ(describe_precision(Precision::kFp32, false, 1.2, ""), "precision fp32");
  EXPECT_EQ(describe_precision(Precision::kFp32, false, 3.94, ""),
            "precision fp32 (this CPU's bf16 matrix products run 3.9x as fast: --precision bf16 "
            "may train faster)");
  EXPECT_EQ(describe_precision(Precision::kBf16, false, 4.0, ""),
            "precision bf16: forward and loss under autocast, parameters and gradients fp32; "
            "this CPU's bf16 matrix products run 4.0x as fast as fp32's");
  EXPECT_EQ(describe_precision(Precision::kBf16, false, 1.1, ""),
            "precision bf16: forward and loss under autocast, parameters and gradients fp32; "
            "this CPU's bf16 matrix products run 1.1x as fast as fp32's (no fast bf16 here: "
            "expect little speed-up, only memory)");
  // Emulated bf16 (an AVX2 CPU, LibTorch 2.11): a 512^3 product at 1/70 of fp32's speed.
  EXPECT_EQ(describe_precision(Precision::kBf16, false, 0.014, ""),
            "precision bf16: forward and loss under autocast, parameters and gradients fp32; "
            "this CPU's bf16 matrix products run 0.01x as fast as fp32's (no fast bf16 here: "
            "expect little speed-up, only memory)");
  EXPECT_EQ(describe_precision(Precision::kFp16, true, 12.5, ""),
            "precision fp16: forward and loss under autocast, parameters and gradients fp32; "
            "this GPU's fp16 matrix products run 12.5x as fast as fp32's");
  EXPECT_EQ(describe_precision(Precision::kBf16, true, 0, "CUDA error: no kernel image"),
            "precision bf16: forward and loss under autocast, parameters and gradients fp32; "
            "the bf16 probe failed on this device: CUDA error: no kernel image");
}

// The vectorised bf16 path against LibTorch's own mixed-dtype add_, bit for bit: random values
// over many magnitudes, zeros of both signs, subnormals, infinities and NaN; lengths that are
// not a multiple of any vector width, one that --threads splits; and the fallbacks.
TEST(AccumulateFp32, AddsBf16IntoFp32ExactlyAsLibTorchsAddDoes) {
  torch::manual_seed(9);
  const auto bits_equal = [](const at::Tensor& a, const at::Tensor& b) {
    return torch::equal(a.view(at::kInt), b.view(at::kInt));
  };
  for (const std::int64_t n : {1, 7, 17, 1000, 70001}) {
    at::Tensor base = torch::randn({n}) * torch::pow(10.0, torch::randint(-40, 30, {n}));
    at::Tensor addend =
        (torch::randn({n}) * torch::pow(10.0, torch::randint(-40, 30, {n}))).to(at::kBFloat16);
    if (n >= 17) {
      const float specials[] = {0.0f,      -0.0f, 1e-40f, -3e-39f, INFINITY,
                                -INFINITY, NAN,   1.0f,   -1.0f,   3.0e38f};
      for (int i = 0; i < 10; ++i) {
        addend[i] = specials[i];
        base[i + 7] = specials[9 - i];
      }
    }
    at::Tensor expected = base.clone();
    expected.add_(addend);
    at::Tensor accumulated = base.clone();
    accumulate_fp32(accumulated, addend);
    EXPECT_TRUE(bits_equal(accumulated, expected)) << "n " << n;
  }
  // Two threads split a long one; a 2-D shape; a non-contiguous addend and an fp32 addend take
  // add_ itself.
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  at::Tensor base = torch::randn({512, 784});
  const at::Tensor addend = torch::randn({512, 784}).to(at::kBFloat16);
  at::Tensor expected = base.clone(), accumulated = base.clone();
  expected.add_(addend);
  accumulate_fp32(accumulated, addend);
  EXPECT_TRUE(bits_equal(accumulated, expected));
  at::set_num_threads(threads);
  const at::Tensor transposed = torch::randn({784, 512}).to(at::kBFloat16).t();
  expected = base.clone().add_(transposed);
  accumulated = base.clone();
  accumulate_fp32(accumulated, transposed);
  EXPECT_TRUE(bits_equal(accumulated, expected));
  const at::Tensor fp32 = torch::randn({512, 784});
  accumulated = base.clone();
  accumulate_fp32(accumulated, fp32);
  EXPECT_TRUE(bits_equal(accumulated, base + fp32));
  // Misuse is refused.
  at::Tensor half = torch::zeros({3}, at::kBFloat16);
  EXPECT_THROW(accumulate_fp32(half, torch::zeros({3})), c10::Error);
  at::Tensor three = torch::zeros({3});
  EXPECT_THROW(accumulate_fp32(three, torch::zeros({4}, at::kBFloat16)), c10::Error);
}

TEST(LossScale, HalvesOnOverflowDoublesAfterTheIntervalAndRestores) {
  LossScale off(false);
  EXPECT_EQ(off.value(), 1.0);
  off.after_overflow();
  EXPECT_EQ(off.value(), 1.0);
  EXPECT_FALSE(off.explains_overflow());

  LossScale scale(true, 1024.0, 3);
  EXPECT_TRUE(scale.explains_overflow());
  scale.after_clean_step();
  scale.after_clean_step();
  scale.after_overflow();  // resets the count of clean steps
  EXPECT_EQ(scale.value(), 512.0);
  EXPECT_EQ(scale.clean_steps(), 0);
  for (int i = 0; i < 2; ++i)
    scale.after_clean_step();
  EXPECT_EQ(scale.value(), 512.0);
  scale.after_clean_step();  // the third in a row
  EXPECT_EQ(scale.value(), 1024.0);
  EXPECT_EQ(scale.clean_steps(), 0);

  LossScale resumed(true);
  resumed.restore(256.0, 7);
  EXPECT_EQ(resumed.value(), 256.0);
  EXPECT_EQ(resumed.clean_steps(), 7);
  resumed.restore(0.0, 0);  // a checkpoint without a scale changes nothing
  EXPECT_EQ(resumed.value(), 256.0);

  // Past the minimum an overflow is no longer the scale's doing.
  LossScale tiny(true, LossScale::kMinimum * 2, 10);
  EXPECT_TRUE(tiny.explains_overflow());
  tiny.after_overflow();
  EXPECT_FALSE(tiny.explains_overflow());
}

// The loss is a sum over what a rank's share counts: the start is 2^16 over that count, as a
// mean's 2^16, and the scale never grows to 2^16, where a summed cross-entropy's gradient of 1
// per logit overflows fp16 (65504) whatever the data.
TEST(LossScale, StartsAtTwoToTheSixteenOverTheCountAndStopsGrowingAtTwoToTheFifteen) {
  EXPECT_EQ(LossScale::initial_for(0), 32768.0);
  EXPECT_EQ(LossScale::initial_for(1), 32768.0);
  EXPECT_EQ(LossScale::initial_for(2), 32768.0);
  EXPECT_EQ(LossScale::initial_for(3), 16384.0);
  EXPECT_EQ(LossScale::initial_for(64), 1024.0);
  EXPECT_EQ(LossScale::initial_for(4096 * 8), 2.0);
  EXPECT_EQ(LossScale::initial_for(4e6), 1.0) << "never below 1 at the start";
  for (const double count : {1.0, 3.0, 100.0, 5000.0, 65536.0}) {
    const double start = LossScale::initial_for(count);
    EXPECT_EQ(start, std::exp2(std::floor(std::log2(start)))) << "a power of two";
    EXPECT_LE(start * count, 65536.0);
    if (start > 1.0 && start < LossScale::kMaximum) {
      EXPECT_GT(2 * start * count, 65536.0) << "the largest such power";
    }
  }
  LossScale scale(true, 16384.0, 2);
  for (int i = 0; i < 10; ++i)
    scale.after_clean_step();
  EXPECT_EQ(scale.value(), LossScale::kMaximum);
  EXPECT_LT(scale.value() * 1.0, 65504.0) << "a gradient of 1 per logit stays finite in fp16";
}

TEST(OverflowInjection, ParsesItemsAndRefusesBadOnesNamingThem) {
  const auto injections = parse_overflow_injections("rank=1,step=2;rank=0,step=5");
  ASSERT_EQ(injections.size(), 2u);
  EXPECT_EQ(injections[0].rank, 1);
  EXPECT_EQ(injections[0].step, 2);
  EXPECT_EQ(injections[1].step, 5);
  for (const char* bad : {"rank=1", "rank=x,step=1", "rank=1,step=-1", "rank=1,when=2"}) {
    try {
      parse_overflow_injections(bad);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--inject-overflow"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace autoaccum::train
