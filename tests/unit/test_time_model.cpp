// fit_time: fits of synthetic compute times (fixed + per padded token + per row x width^2),
// checked against the coefficients that made them, and against every non-negative set of
// coefficients on a grid (none errs less than the fit).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "autoaccum/train/sizing/time_model.hpp"

namespace autoaccum::train {
namespace {

using Timed = std::vector<std::pair<MicroBatchShape, double>>;

// A piece of `count` documents padded to `width`, as the planner and the probe shape it.
MicroBatchShape piece(double count, double width) {
  return MicroBatchShape{count * width, count * width * width};
}

// The probe's shapes for a budget of 1200 tokens, longest document 256: the budget and a quarter
// of it at the longest width, the budget at width 96, one document of 32.
Timed probe_shapes(const TimeFit& truth) {
  Timed out;
  for (const auto shape : {piece(4, 256), piece(1, 256), piece(12, 96), piece(1, 32)})
    out.push_back({shape, truth.predict(shape)});
  return out;
}

// The sum of squared errors relative to each time, as fit_time weighs them.
double relative_error(const TimeFit& fit, const Timed& timed) {
  double sum = 0;
  for (const auto& [shape, seconds] : timed) {
    const double r = fit.predict(shape) / seconds - 1;
    sum += r * r;
  }
  return sum;
}

TEST(TimeModel, RecoversTheCoefficientsThatMadeTheTimes) {
  // The benchmark GPT's fit on this CPU (docs/benchmarks.md): 4.5 ms + 23 us x tokens + 0.14 us
  // x tokens x width.
  const TimeFit truth{4.5e-3, 23e-6, 0.14e-6};
  const auto fit = fit_time(probe_shapes(truth));
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->fixed / truth.fixed, 1.0, 1e-9);
  EXPECT_NEAR(fit->per_unit / truth.per_unit, 1.0, 1e-9);
  EXPECT_NEAR(fit->per_square / truth.per_square, 1.0, 1e-9);
  // In padded tokens: 4.5 ms / 23 us per micro-batch, each token 1 + 0.14 / 23 x width.
  const data::PieceCost cost = fit->piece_cost();
  EXPECT_NEAR(cost.fixed, 4.5e-3 / 23e-6, 1e-6);
  EXPECT_NEAR(cost.width, 0.14 / 23, 1e-9);
  for (const auto& [count, width] : {std::pair{3, 200}, std::pair{40, 17}}) {
    EXPECT_NEAR(cost.of(count, width) * fit->per_unit, fit->predict(piece(count, width)), 1e-12);
  }
}

TEST(TimeModel, OneWidthLeavesNoWidthTerm) {
  // Every piece at width 64: a token's width term cannot be told from its own cost; the fit
  // keeps fixed + per token and predicts every timed piece exactly.
  const TimeFit truth{2e-3, 30e-6, 0.2e-6};
  Timed timed;
  for (const double count : {1.0, 4.0, 16.0})
    timed.push_back({piece(count, 64), truth.predict(piece(count, 64))});
  const auto fit = fit_time(timed);
  ASSERT_TRUE(fit);
  EXPECT_EQ(fit->per_square, 0);
  for (const auto& [shape, seconds] : timed)
    EXPECT_NEAR(fit->predict(shape) / seconds, 1.0, 1e-9);
}

TEST(TimeModel, NoisyTimesFitNoWorseThanAnyNonNegativeCoefficients) {
  std::mt19937 generator(7);
  std::uniform_real_distribution<double> noise(0.95, 1.05);
  for (int draw = 0; draw < 50; ++draw) {
    const TimeFit truth{std::uniform_real_distribution<double>(0, 5e-3)(generator),
                        std::uniform_real_distribution<double>(5e-6, 50e-6)(generator),
                        std::uniform_real_distribution<double>(0, 0.3e-6)(generator)};
    Timed timed = probe_shapes(truth);
    for (auto& point : timed)
      point.second *= noise(generator);
    const auto fit = fit_time(timed);
    ASSERT_TRUE(fit);
    EXPECT_GE(fit->fixed, 0);
    EXPECT_GT(fit->per_unit, 0);
    EXPECT_GE(fit->per_square, 0);
    const double best = relative_error(*fit, timed);
    // A grid over every coefficient around the truth (0 included): none beats the fit.
    for (int a = 0; a <= 20; ++a)
      for (int b = 1; b <= 20; ++b)
        for (int c = 0; c <= 20; ++c) {
          const TimeFit other{truth.fixed * a / 10.0, truth.per_unit * b / 10.0,
                              truth.per_square * c / 10.0};
          ASSERT_GE(relative_error(other, timed), best * (1 - 1e-9)) << draw;
        }
    // 5% noise on each time: the fit stays within 10% of every timed piece.
    for (const auto& [shape, seconds] : timed)
      EXPECT_NEAR(fit->predict(shape) / seconds, 1.0, 0.1) << draw;
  }
}

TEST(TimeModel, TimesThatFallWithTokensStillGiveAPositiveCostPerToken) {
  // A larger piece timed faster than a smaller one (noise on a tiny model): the per-token cost
  // stays positive, the rest non-negative.
  const Timed timed = {{piece(1, 100), 1.0}, {piece(2, 100), 0.9}};
  const auto fit = fit_time(timed);
  ASSERT_TRUE(fit);
  EXPECT_GT(fit->per_unit, 0);
  EXPECT_GE(fit->fixed, 0);
  EXPECT_EQ(fit->per_square, 0);
}

TEST(TimeModel, TooLittleTimedFitsNothing) {
  EXPECT_FALSE(fit_time({}));
  EXPECT_FALSE(fit_time({{piece(2, 64), 0.01}}));
  // Unusable points (no time, no tokens) do not count.
  EXPECT_FALSE(fit_time({{piece(2, 64), 0.01}, {piece(4, 64), 0.0}, {MicroBatchShape{}, 0.5}}));
  EXPECT_TRUE(fit_time({{piece(2, 64), 0.01}, {piece(4, 64), 0.02}}));
}

TEST(TimeModel, DescribesItsCoefficientsInReadableUnits) {
  EXPECT_EQ((TimeFit{4.5e-3, 23e-6, 0.14e-6}.describe()),
            "4.5 ms + 23 us/token + 140 ns/token x width");
  EXPECT_EQ((TimeFit{0, 1.5e-3, 0}.describe()), "0 ns + 1.5 ms/token");
}

}  // namespace
}  // namespace autoaccum::train
