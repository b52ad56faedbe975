// MemoryModel: fits of synthetic peaks (affine in rows; tokens plus width^2 for documents),
// predictions checked against the largest size computed directly from the true peak function.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>

#include "autoaccum/train/sizing/memory_model.hpp"

namespace autoaccum::train {
namespace {

// The largest u with truth(u) <= limit, by scanning (independent of the model's algebra).
template <class Truth>
std::int64_t largest_by_scan(Truth truth, double limit, std::int64_t cap) {
  std::int64_t best = 0;
  for (std::int64_t u = 1; u <= cap; ++u)
    if (truth(static_cast<double>(u)) <= limit) best = u;
  return best;
}

TEST(MemoryModel, NothingToPredictFromOnePointOrFlatPeaks) {
  MemoryModel model;  // no base given
  EXPECT_FALSE(model.fit());
  model.observe({16, 0}, 1000);
  EXPECT_FALSE(model.fit());
  model.observe({16, 0}, 1100);  // the same size twice: no slope
  EXPECT_FALSE(model.fit());
  EXPECT_FALSE(model.largest(1 << 20, 0.05, 256));
  MemoryModel flat;
  flat.observe({8, 0}, 5000);
  flat.observe({16, 0}, 5000);
  EXPECT_FALSE(flat.fit());  // memory does not grow: nothing to extrapolate
}

TEST(MemoryModel, OneSizeWithABaseIsTheLineFromTheBase) {
  // Truth: 1000 (state) + 200 (an attempt's fixed cost) + 50 per row; measured at 16 rows only.
  MemoryModel model;
  model.set_base(1000);
  model.observe({16, 0}, 1000 + 200 + 50 * 16);
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  EXPECT_EQ(fit->fixed, 1000);
  EXPECT_EQ(fit->per_unit, (200.0 + 50 * 16) / 16);  // the attempt's cost counted per row
  // So it predicts fewer rows than fit (never more): 4000 bytes hold 56 rows, it says 48.
  EXPECT_EQ(*model.largest(4000, 0.0, 1000), 48);
  EXPECT_LE(*model.largest(4000, 0.0, 1000), (4000 - 1200) / 50);
}

TEST(MemoryModel, AffineRowsRecoveredExactlyAndPredictionMatchesScan) {
  const double fixed = 7.7 * (1 << 20), per_row = 71.0 * 1024;
  const auto truth = [&](double u) { return fixed + per_row * u; };
  MemoryModel model;
  model.observe({16, 0}, std::llround(truth(16)));
  model.observe({32, 0}, std::llround(truth(32)));
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->fixed, fixed, 1.0);
  EXPECT_NEAR(fit->per_unit, per_row, 0.1);
  EXPECT_EQ(fit->per_square, 0.0);
  const auto limit = static_cast<std::int64_t>(fixed + per_row * 118.5);
  // No margin: exactly the largest size under the limit.
  EXPECT_EQ(*model.largest(limit, 0.0, 1024), largest_by_scan(truth, limit, 1024));
  EXPECT_EQ(*model.largest(limit, 0.0, 1024), 118);
  // 5% of the room kept free: floor(0.95 x 118.5).
  EXPECT_EQ(*model.largest(limit, 0.05, 1024), 112);
  EXPECT_EQ(*model.largest(limit, 0.0, 100), 100);  // capped at the rank's share
  EXPECT_EQ(*model.largest(0, 0.05, 300), 300);     // no limit: the cap
  // Fixed state at or past the limit: nothing fits.
  EXPECT_EQ(*model.largest(static_cast<std::int64_t>(fixed), 0.0, 1024), 0);
}

TEST(MemoryModel, InterceptCoversEveryNoisyMeasurement) {
  std::mt19937 random(7);
  std::uniform_real_distribution<double> noise(0.0, 40000.0);
  const double fixed = 3e6, per_row = 20000;
  MemoryModel model;
  std::vector<std::pair<double, double>> seen;
  for (double u : {4.0, 8.0, 8.0, 16.0, 24.0, 32.0}) {
    const double peak = std::round(fixed + per_row * u + noise(random));
    model.observe({u, 0}, static_cast<std::int64_t>(peak));
    seen.emplace_back(u, peak);
  }
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  for (const auto& [u, peak] : seen)
    EXPECT_GE(fit->predict({u, 0}) + 1e-6, peak);
  EXPECT_NEAR(fit->per_unit, per_row, 0.1 * per_row);
}

TEST(MemoryModel, FailureBoundsThePrediction) {
  MemoryModel model;
  model.observe({10, 0}, 1000 + 10 * 100);
  model.observe({20, 0}, 1000 + 20 * 100);
  EXPECT_EQ(*model.largest(1000 + 100 * 100, 0.0, 1000), 100);
  model.ran_out({80, 0});  // the model said 100; 80 did not fit
  EXPECT_EQ(*model.largest(1000 + 100 * 100, 0.0, 1000), 79);
  model.ran_out({90, 0});  // a larger failure leaves the bound where it was
  EXPECT_EQ(model.failed_units(), 80);
}

TEST(MemoryModel, DocumentsTokensAndWidthSquaredBothFitted) {
  // Peak = fixed + a x tokens + b x rows x width^2, micro-batches of assorted widths.
  const double fixed = 2e6, a = 900, b = 3.5;
  const auto truth = [&](double rows, double width) {
    return fixed + a * rows * width + b * rows * width * width;
  };
  MemoryModel model;
  const double shapes[][2] = {{4, 100}, {16, 30}, {2, 250}, {8, 64}, {1, 256}};
  for (const auto& s : shapes) {
    const MicroBatchShape shape{s[0] * s[1], s[0] * s[1] * s[1]};
    model.observe(shape, std::llround(truth(s[0], s[1])));
  }
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->per_unit, a, 1e-3 * a);
  EXPECT_NEAR(fit->per_square, b, 1e-3 * b);
  EXPECT_NEAR(fit->fixed, fixed, 1e-4 * fixed);
  // A budget of u tokens at the longest width 256: rows = u / 256.
  const double limit = 6e6;
  const auto at_width = [&](double u) { return truth(u / 256.0, 256.0); };
  const std::int64_t scan = largest_by_scan(at_width, limit, 1 << 16);
  const std::int64_t predicted =
      *model.largest(static_cast<std::int64_t>(limit), 0.0, 1 << 16, 256);
  EXPECT_NEAR(static_cast<double>(predicted), static_cast<double>(scan), 2.0);
  EXPECT_LE(at_width(static_cast<double>(predicted)), limit + 1.0);
}

TEST(MemoryModel, SameWidthEverywhereFallsBackToTokensAlone) {
  // Every micro-batch at width 64: width^2 is proportional to tokens, so only one slope.
  MemoryModel model;
  for (double rows : {2.0, 4.0, 8.0})
    model.observe({rows * 64, rows * 64 * 64}, std::llround(1e6 + 500 * rows * 64));
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->per_unit, 500, 1e-6);
  EXPECT_EQ(fit->per_square, 0.0);
}

TEST(MemoryModel, WidthSquaredAloneWhenTheTokenSlopeComesOutNegative) {
  // Attention-bound memory: peak = fixed + b x rows x width^2, measured at two micro-batches of
  // width 256 and one of width 32 (the probe's narrow point) whose peak reads 20 kB low. Both
  // slopes would put tokens below zero; tokens alone would charge 1,104 B a token where a token
  // at width 256 takes 768 B. Width^2 alone explains more, and predicts at width 256.
  const double fixed = 1e6, b = 3.0;
  const auto truth = [&](double rows, double width) { return fixed + b * rows * width * width; };
  MemoryModel model;
  for (const auto& [rows, width, noise] :
       {std::tuple{4.0, 256.0, 0.0}, std::tuple{8.0, 256.0, 0.0}, std::tuple{32.0, 32.0, -2e4}})
    model.observe({rows * width, rows * width * width}, std::llround(truth(rows, width) + noise));
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  EXPECT_EQ(fit->per_unit, 0.0);
  EXPECT_NEAR(fit->per_square, b, 0.02 * b);
  const double limit = 6e6;
  const auto at_width = [&](double u) { return truth(u / 256.0, 256.0); };
  const std::int64_t scan = largest_by_scan(at_width, limit, 1 << 16);
  const std::int64_t predicted =
      *model.largest(static_cast<std::int64_t>(limit), 0.0, 1 << 16, 256);
  EXPECT_LE(at_width(static_cast<double>(predicted)), limit);
  EXPECT_GE(static_cast<double>(predicted), 0.97 * static_cast<double>(scan));
}

TEST(MemoryModel, OnePointPerShapeAtItsHighestPeakAndABoundedHistory) {
  MemoryModel model;
  model.set_base(1000000);
  for (int step = 0; step < 1000; ++step)
    model.observe({8, 0}, 1000000 + 8 * 100 + (step == 500 ? 80 : 0));
  EXPECT_EQ(model.observations(), 1u);
  const auto fit = model.fit();
  ASSERT_TRUE(fit);
  EXPECT_NEAR(fit->per_unit, 110.0, 1e-9);  // the line through the highest peak (1000880)
  // Documents' shapes differ almost every time: the history stays bounded.
  for (int i = 1; i <= 1000; ++i)
    model.observe({static_cast<double>(i), static_cast<double>(i) * 7}, 1000000 + 100 * i);
  EXPECT_EQ(model.observations(), 256u);
  ASSERT_TRUE(model.fit());
  EXPECT_NEAR(model.fit()->per_unit + 7 * model.fit()->per_square, 100.0, 1e-6);
}

TEST(MemoryModel, ARecordRestoresAModelThatPredictsAndLearnsAlike) {
  // Noisy documents' peaks, a failure and a base: the restored model fits, predicts and then
  // learns from the same new measurements exactly as the one it was recorded from.
  MemoryModel model;
  model.set_base(3000000);
  for (int i = 1; i <= 40; ++i) {
    const double rows = 1 + i % 7, width = 16 + (i * 37) % 200;
    model.observe({rows * width, rows * width * width},
                  3000000 + std::llround(rows * width * 700 + rows * width * width * 2.5) +
                      (i * 7919) % 5000);
  }
  model.ran_out({2400, 2400 * 256});
  MemoryModel restored = MemoryModel::from_record(model.record());
  const auto same = [](const MemoryModel& a, const MemoryModel& b) {
    const auto fa = a.fit(), fb = b.fit();
    ASSERT_TRUE(fa && fb);
    EXPECT_EQ(fa->fixed, fb->fixed);
    EXPECT_EQ(fa->per_unit, fb->per_unit);
    EXPECT_EQ(fa->per_square, fb->per_square);
    EXPECT_EQ(a.failed_units(), b.failed_units());
    EXPECT_EQ(a.observations(), b.observations());
    EXPECT_EQ(a.largest(9000000, 0.05, 1 << 16, 256), b.largest(9000000, 0.05, 1 << 16, 256));
  };
  same(model, restored);
  EXPECT_EQ(restored.failed_units(), 2400);
  for (MemoryModel* m : {&model, &restored}) {
    m->observe({512, 512 * 64}, 3000000 + 512 * 900);
    m->ran_out({1800, 1800 * 200});
  }
  same(model, restored);
  // Nothing recorded: nothing to predict from.
  EXPECT_FALSE(MemoryModel::from_record(MemoryModel{}.record()).fit());
}

TEST(MemoryModel, Describe) {
  const MemoryFit fit{7.7 * (1 << 20), 71.0 * 1024, 0};
  EXPECT_EQ(MemoryModel::describe(fit, "row"), "fixed 7.7 MiB + 71.0 KiB/row");
}

}  // namespace
}  // namespace autoaccum::train
