// The trainer's pure pieces: the reduce layout, the step agreement, parameter identity, the
// buffer averaging and undo of ModelState, and the one-line summary of a TorchScript error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "autoaccum/train/model/model.hpp"
#include "autoaccum/train/model/model_state.hpp"
#include "autoaccum/train/reduce/reduce_layout.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "autoaccum/train/step/step_agreement.hpp"

namespace autoaccum::train {
namespace {

TEST(ReduceLayout, RegionsFollowEachOtherAndNamesAreUnique) {
  ReduceLayout layout;
  const auto g = layout.add("gradients", 10);
  const auto b = layout.add("buffers", 0);
  const auto c = layout.add("control", 5);
  EXPECT_EQ(layout[g].offset, 0);
  EXPECT_EQ(layout[b].offset, 10);
  EXPECT_EQ(layout[c].offset, 10);
  EXPECT_EQ(layout.size(), 15);
  ASSERT_NE(layout.find("control"), nullptr);
  EXPECT_EQ(layout.find("control")->count, 5);
  EXPECT_EQ(layout.find("missing"), nullptr);
  EXPECT_THROW(layout.add("control", 1), std::logic_error);
  EXPECT_THROW(layout.add("negative", -1), std::logic_error);
}

// Sums per-rank control arrays as the all-reduce would.
std::vector<float> reduce(const ControlLayout& layout, const std::vector<RankReport>& reports,
                          const std::vector<double>& losses, double weight_per_rank = 0.5) {
  std::vector<float> sum(static_cast<std::size_t>(layout.count()), 0.0f);
  for (int r = 0; r < layout.world; ++r) {
    std::vector<float> mine(sum.size(), 0.0f);
    write_report(layout, r, reports[static_cast<std::size_t>(r)], mine.data());
    // The loss and weight slots, as the trainer writes them beside the report.
    comm::write_exact(losses[static_cast<std::size_t>(r)], mine.data() + layout.loss(r));
    comm::write_exact(weight_per_rank, mine.data() + layout.weight(r));
    for (std::size_t i = 0; i < sum.size(); ++i)
      sum[i] += mine[i];
  }
  return sum;
}

TEST(StepAgreement, NamesTheRanksThatRanOutAndWhere) {
  const ControlLayout layout{4};
  std::vector<RankReport> reports(4);
  reports[1] = RankReport{true, AttemptPhase::kBackward, 3 << 20, false};
  reports[3] = RankReport{true, AttemptPhase::kForward, 5 << 20, true};
  reports[1].peak_shape = {4096.0 * 3 + 1, 4096.0 * 4096 * 3};  // tokens past float's 2^24 below
  reports[2].peak_shape = {16777217.0, 0};
  reports[2].base_bytes = (std::int64_t{1} << 40) + 3;  // a GPU's state, to the byte
  const auto reduced = reduce(layout, reports, {0.25f, 0.0f, 0.5f, 0.0f});
  const StepOutcome outcome = agree_on_step(layout, reduced.data());
  EXPECT_FALSE(outcome.succeeded());
  EXPECT_EQ(outcome.out_of_memory, (std::vector<int>{1, 3}));
  EXPECT_EQ(outcome.ranks_text(), "ranks 1, 3");
  EXPECT_EQ(outcome.phases_text(), " (rank 1 in backward, rank 3 in forward)");
  EXPECT_EQ(outcome.peak_bytes[3], 5 << 20);
  EXPECT_EQ(outcome.peak_shapes[1].units, 4096.0 * 3 + 1);
  EXPECT_EQ(outcome.peak_shapes[1].square, 4096.0 * 4096 * 3);
  EXPECT_EQ(outcome.peak_shapes[2].units, 16777217.0) << "exact past float's 2^24";
  EXPECT_EQ(outcome.peak_shapes[0].units, 0.0);
  EXPECT_EQ(outcome.base_bytes[2], (std::int64_t{1} << 40) + 3);
  EXPECT_TRUE(outcome.stop);
  EXPECT_FLOAT_EQ(static_cast<float>(outcome.loss_sum), 0.75f);
  EXPECT_FLOAT_EQ(static_cast<float>(outcome.weight), 2.0f);
  EXPECT_FLOAT_EQ(static_cast<float>(outcome.loss), 0.375f) << "the sum over the counted items";
}

TEST(StepAgreement, SuccessWhenNoRankRanOut) {
  const ControlLayout layout{3};
  std::vector<RankReport> reports(3);
  reports[2].peak_bytes = 7 << 10;
  const auto reduced = reduce(layout, reports, {1.0f, 2.0f, 3.0f});
  const StepOutcome outcome = agree_on_step(layout, reduced.data());
  EXPECT_TRUE(outcome.succeeded());
  EXPECT_FALSE(outcome.stop);
  EXPECT_DOUBLE_EQ(outcome.loss, 6.0 / 1.5);
  const auto nothing_counted = reduce(layout, reports, {0, 0, 0}, 0.0);
  EXPECT_EQ(agree_on_step(layout, nothing_counted.data()).loss, 0.0) << "no division by zero";
  EXPECT_EQ(outcome.peak_bytes, (std::vector<std::int64_t>{0, 0, 7 << 10}));
  EXPECT_EQ(outcome.phases_text(), "");

  std::vector<RankReport> one(3);
  one[0] = RankReport{true, AttemptPhase::kBackward, 0, false};
  const auto failed = reduce(layout, one, {0, 0, 0});
  EXPECT_EQ(agree_on_step(layout, failed.data()).phases_text(), " in backward");
  EXPECT_EQ(agree_on_step(layout, failed.data()).ranks_text(), "rank 0");
}

TEST(StepAgreement, CountsAndLossSumsStayExactPastFloatPrecision) {
  // LLM global batches count millions of tokens: 2^24 + 1 is the first count a float32 slot
  // cannot hold, and a loss sum keeps its double bits.
  for (const int world : {1, 3, 64}) {
    const ControlLayout layout{world};
    const std::vector<RankReport> reports(static_cast<std::size_t>(world));
    std::vector<double> losses;
    for (int r = 0; r < world; ++r)
      losses.push_back(1e8 / 3.0 + r * 1e-3);
    const double tokens = 16777217.0;
    const auto reduced = reduce(layout, reports, losses, tokens);
    const StepOutcome outcome = agree_on_step(layout, reduced.data());
    double loss_sum = 0;
    for (double l : losses)
      loss_sum += l;
    EXPECT_EQ(outcome.weight, tokens * world) << "world " << world;
    EXPECT_EQ(outcome.loss_sum, loss_sum) << "world " << world;
    EXPECT_EQ(outcome.loss, loss_sum / (tokens * world));
  }
  // Peaks past 16 GiB to the byte, and the pieces of awkward values.
  const ControlLayout layout{2};
  std::vector<RankReport> reports(2);
  reports[1].peak_bytes = (std::int64_t{80} << 30) + 12345;
  EXPECT_EQ(agree_on_step(layout, reduce(layout, reports, {0, 0}).data()).peak_bytes[1],
            reports[1].peak_bytes);
  for (const double value : {0.0, -0.0, 1.0 / 3.0, -7e-20, 123456789.123456789, 3.0e38, 1e300,
                             -HUGE_VAL, std::nan("")}) {
    float slots[comm::kExactSlots];
    comm::write_exact(value, slots);
    const double back = comm::read_exact(slots);
    if (std::isnan(value))
      EXPECT_TRUE(std::isnan(back));
    else if (std::abs(value) > 3.5e38)
      EXPECT_EQ(back, std::copysign(HUGE_VAL, value)) << "beyond float: infinite, not finite";
    else
      EXPECT_EQ(back, value);
  }
}

TEST(StepAgreement, EveryRanksPlanArrivesOnEveryRank) {
  // Documents: each rank's micro-batches and real and padded tokens, as its own plan counted
  // them (no rank cuts another's share to log it), the tokens past 2^24.
  const ControlLayout layout{3};
  std::vector<RankReport> reports(3);
  for (int r = 0; r < 3; ++r) {
    auto& report = reports[static_cast<std::size_t>(r)];
    report.pieces = 17 + r;
    report.tokens = (std::int64_t{1} << 24) + 1 + r;
    report.padded_tokens = (std::int64_t{5} << 30) + 3 * r + 1;
  }
  const StepOutcome outcome = agree_on_step(layout, reduce(layout, reports, {0, 0, 0}).data());
  for (int r = 0; r < 3; ++r) {
    const auto i = static_cast<std::size_t>(r);
    EXPECT_EQ(outcome.pieces.at(i), reports[i].pieces);
    EXPECT_EQ(outcome.tokens.at(i), reports[i].tokens);
    EXPECT_EQ(outcome.padded_tokens.at(i), reports[i].padded_tokens);
  }
  EXPECT_TRUE(outcome.succeeded());
  EXPECT_FALSE(outcome.stop);
}

TEST(StepAgreement, OneRankThatStoppedBetweenMicroBatchesDropsTheStepEverywhere) {
  const ControlLayout layout{3};
  std::vector<RankReport> reports(3);
  reports[1].stop_requested = true;
  reports[1].abandoned = true;
  reports[2].stop_requested = true;  // saw the signal only after its last micro-batch
  const auto reduced = reduce(layout, reports, {1.0f, 0.5f, 3.0f});
  const StepOutcome outcome = agree_on_step(layout, reduced.data());
  EXPECT_TRUE(outcome.abandoned);
  EXPECT_TRUE(outcome.stop);
  EXPECT_FALSE(outcome.succeeded()) << "an incomplete gradient must not be applied";
  EXPECT_TRUE(outcome.out_of_memory.empty()) << "and it is not an out-of-memory to retry";

  std::vector<RankReport> late(3);
  late[0].stop_requested = true;
  const auto whole = reduce(layout, late, {1.0f, 1.0f, 1.0f});
  const StepOutcome completed = agree_on_step(layout, whole.data());
  EXPECT_TRUE(completed.succeeded()) << "a signal after the last micro-batch keeps the step";
  EXPECT_TRUE(completed.stop);
  EXPECT_FALSE(completed.abandoned);
}

TEST(StepAgreement, NonFiniteIsSeenInLossOrGradient) {
  EXPECT_TRUE(step_is_finite(1.0, -3.0));
  EXPECT_FALSE(step_is_finite(std::nan(""), 0.0));
  EXPECT_FALSE(step_is_finite(0.0, INFINITY));
}

TEST(Parameters, TiedAreOneAndFrozenApart) {
  at::Tensor shared = torch::ones({2, 3}, torch::requires_grad());
  at::Tensor frozen = torch::ones({4});
  at::Tensor bias = torch::zeros({3}, torch::requires_grad());
  const NamedTensors named = {
      {"enc.weight", shared}, {"body.w", frozen}, {"dec.weight", shared}, {"dec.bias", bias}};
  const ParameterSet set = distinct_parameters(named);
  ASSERT_EQ(set.trainable.size(), 2u);
  EXPECT_TRUE(set.trainable[0].is_same(shared));
  EXPECT_TRUE(set.trainable[1].is_same(bias));
  ASSERT_EQ(set.frozen.size(), 1u);
  EXPECT_EQ(set.trainable_elements, 9);
  EXPECT_EQ(set.frozen_elements, 4);
  EXPECT_EQ(set.shared_elements, 6);
  EXPECT_EQ(set.describe(), "9 trainable parameters (4 frozen, 6 shared)");
}

// A model with a floating and an integer buffer, as BatchNorm has.
class BufferModel final : public Model {
 public:
  at::Tensor mean = torch::zeros({3});
  at::Tensor count = torch::zeros({}, torch::kLong);
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override { return inputs.at(0); }
  NamedTensors named_parameters() override { return {}; }
  NamedTensors named_buffers() override { return {{"mean", mean}, {"count", count}}; }
  void set_training(bool) override {}
  void to(const c10::Device&) override {}
  std::string describe() override { return "buffers"; }
};

TEST(ModelState, AFailedAttemptLeavesBuffersAndRandomNumbersAsTheyWere) {
  BufferModel model;
  ModelState state(model, c10::Device(c10::kCPU));
  EXPECT_EQ(state.reduce_count(), 4);
  torch::manual_seed(5);
  const at::Tensor expected_draw = torch::rand({4});
  torch::manual_seed(5);
  {
    AttemptGuard guard(state);
    model.mean.add_(1.0);
    model.count.add_(1);
    (void)torch::rand({4});  // a failed attempt's dropout
  }
  EXPECT_TRUE(torch::equal(model.mean, torch::zeros({3})));
  EXPECT_EQ(model.count.item<std::int64_t>(), 0);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected_draw)) << "the retry draws the same numbers";
  {
    AttemptGuard guard(state);
    model.mean.add_(2.0);
    guard.commit();
  }
  EXPECT_TRUE(torch::equal(model.mean, torch::full({3}, 2.0)));
}

TEST(ModelState, MeanChangeOverRanksIsExactForUnchangedAndIntegerBuffers) {
  BufferModel model;
  model.mean.copy_(torch::tensor({0.1f, 0.2f, 0.3f}));
  model.count.fill_(7);
  ModelState state(model, c10::Device(c10::kCPU), 3, 0);
  state.capture();
  // This rank moved mean[0] by 0.4 and counted 2 micro-batches; the other two ranks' changes
  // (0.2 and 0.0 for mean[0]; 2 and 3 micro-batches) arrive through the sum.
  model.mean[0] += 0.4f;
  model.count.add_(2);
  at::Tensor region = torch::zeros({4});
  state.write_changes(region);
  EXPECT_NEAR(region[0].item<float>(), 0.4f, 1e-6);
  EXPECT_EQ(region[1].item<float>(), 0.0f);
  EXPECT_EQ(region[3].item<float>(), 2.0f);
  region[0] += 0.2f;
  region[3] += 5.0f;  // 2 + 3
  state.apply_mean_change(region);
  EXPECT_NEAR(model.mean[0].item<float>(), 0.1f + 0.6f / 3, 1e-6);
  EXPECT_EQ(model.mean[1].item<float>(), 0.2f) << "unchanged buffers stay bit for bit";
  EXPECT_EQ(model.mean[2].item<float>(), 0.3f);
  EXPECT_EQ(model.count.item<std::int64_t>(), 7 + 2) << "7 + round(7 / 3)";
}

// A float64 buffer, as a model that tallies in double has.
class DoubleModel final : public Model {
 public:
  at::Tensor tally = torch::full({2}, 1.0e6, torch::kDouble);
  at::Tensor forward(const std::vector<at::Tensor>& inputs) override { return inputs.at(0); }
  NamedTensors named_parameters() override { return {}; }
  NamedTensors named_buffers() override { return {{"tally", tally}}; }
  void set_training(bool) override {}
  void to(const c10::Device&) override {}
  std::string describe() override { return "double buffer"; }
};

TEST(ModelState, AFloat64BuffersMeanChangeKeepsItsBitsAndIsTheSameOnEveryRank) {
  // Three ranks' changes with more bits than a float holds: through one float slot each, the
  // mean moved by up to 2^-24 of the change (the old behaviour, checked to differ below).
  const int world = 3;
  const double changes[world][2] = {{1234567.8912345678, 1e-9 / 3}, {0.1, 2.0 / 3}, {-7.25, 0}};
  std::vector<DoubleModel> models(world);
  std::vector<std::unique_ptr<ModelState>> states;
  at::Tensor sum;
  for (int r = 0; r < world; ++r) {
    states.push_back(std::make_unique<ModelState>(models[r], c10::Device(c10::kCPU), world, r));
    EXPECT_EQ(states[r]->reduce_count(), 2 * 3 * world);
    EXPECT_EQ(states[r]->averaged_values(), 2);
    states[r]->capture();
    models[r].tally += torch::tensor({changes[r][0], changes[r][1]}, torch::kDouble);
    at::Tensor region = torch::full({states[r]->reduce_count()}, 99.0f);  // stale values
    states[r]->write_changes(region);
    sum = sum.defined() ? sum + region : region;  // the all-reduce, in float
  }
  for (int r = 0; r < world; ++r)
    states[r]->apply_mean_change(sum);
  for (int e = 0; e < 2; ++e) {
    double total = 0.0;  // in rank order, as every rank adds
    float rounded = 0.0f;
    for (int r = 0; r < world; ++r) {
      total += changes[r][e];
      rounded += static_cast<float>(changes[r][e]);
    }
    const double expected = 1.0e6 + total / world;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(models[r].tally[e].item<double>(), expected) << "rank " << r << ", element " << e;
    }
    if (e == 0) {
      EXPECT_NE(1.0e6 + static_cast<double>(rounded) / world, expected);
    }
  }
}

TEST(ExactPieces, AreWriteExactsPiecesComputedOnTensors) {
  const std::vector<double> values = {1234567.8912345678, -0.1, 1e-30, 16777217.0, 0.0, 2.0 / 3};
  const at::Tensor pieces = exact_pieces(torch::tensor(values, torch::kDouble));
  ASSERT_EQ(pieces.numel(), static_cast<std::int64_t>(values.size() * comm::kExactSlots));
  for (std::size_t i = 0; i < values.size(); ++i) {
    float expected[comm::kExactSlots];
    comm::write_exact(values[i], expected);
    for (std::size_t k = 0; k < comm::kExactSlots; ++k)
      EXPECT_EQ(pieces[static_cast<std::int64_t>(i * comm::kExactSlots + k)].item<float>(),
                expected[k])
          << values[i] << " piece " << k;
    EXPECT_EQ(comm::read_exact(expected), values[i]);
  }
}

TEST(ModelState, GeneratorStateRoundTrips) {
  BufferModel model;
  ModelState state(model, c10::Device(c10::kCPU));
  seed_generators_for_rank(3, 1);
  const std::string saved = state.generator_state();
  const at::Tensor first = torch::rand({5});
  EXPECT_EQ(state.set_generator_state(saved, 0), 1u);
  EXPECT_TRUE(torch::equal(torch::rand({5}), first));
  seed_generators_for_rank(3, 0);
  EXPECT_FALSE(torch::equal(torch::rand({5}), first)) << "ranks draw different streams";
  EXPECT_THROW(state.set_generator_state("short", 0), std::exception);
}

TEST(TorchErrorSummary, KeepsTheInterpretersLastLine) {
  const std::runtime_error scripted(
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript (most recent call last):\n"
      "  File \"code/__torch__.py\", line 8, in forward\n"
      "    return (fc).forward(x, )\n"
      "            ~~~~~~~~~~~ <--- HERE\n"
      "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x8 and 100x3)\n");
  EXPECT_EQ(torch_error_summary(scripted),
            "mat1 and mat2 shapes cannot be multiplied (2x8 and 100x3)");
  const std::runtime_error plain("forward() expected at most 2 argument(s) but received 3\nmore");
  EXPECT_EQ(torch_error_summary(plain), "forward() expected at most 2 argument(s) but received 3");
}

}  // namespace
}  // namespace autoaccum::train

TEST(SquareSum, SameBitsAtEveryThreadCountAndNonFiniteWhenAnElementIs) {
  // Gradient clipping and the non-finite check decide from this on every rank: ranks with other
  // thread counts must reach the same bits (LibTorch's norm() does not, in the last bits).
  const int threads = at::get_num_threads();
  torch::manual_seed(7);
  const at::Tensor values = torch::randn({3 * (1 << 16) + 37}) * 1e3;
  at::set_num_threads(1);
  const double one = autoaccum::train::square_sum(values);
  at::set_num_threads(4);
  const double four = autoaccum::train::square_sum(values);
  at::set_num_threads(threads);
  EXPECT_EQ(one, four);
  const double reference = values.to(at::kDouble).square().sum().item<double>();
  EXPECT_NEAR(one, reference, 1e-12 * reference);
  EXPECT_EQ(autoaccum::train::square_sum(torch::zeros({0})), 0.0);
  at::Tensor bad = values.clone();
  bad[12345] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(autoaccum::train::square_sum(bad)));
  bad[12345] = std::nanf("");
  EXPECT_TRUE(std::isnan(autoaccum::train::square_sum(bad)));
  const at::Tensor huge = torch::full({1 << 16}, std::numeric_limits<float>::max());
  EXPECT_TRUE(std::isfinite(autoaccum::train::square_sum(huge))) << "no overflow in double";
}
