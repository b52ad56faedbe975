// StepRunner alone, on one process: a step's update equals the one LibTorch computes from the
// whole batch's mean loss, also when the first attempt runs out of memory and the batch is taken
// again in smaller micro-batches (the retry told to the observers and counted).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "autoaccum/train/model/model_bundle.hpp"
#include "autoaccum/train/step/step_runner.hpp"
#include "test_comm.hpp"
#include "test_rows_file.hpp"

namespace autoaccum::train {
namespace {

// Records what the step tells.
class Recorder : public StepObserver {
 public:
  explicit Recorder(std::vector<OomEvent>& events) : events_(events) {}
  void on_oom(const OomEvent& event) override { events_.push_back(event); }

 private:
  std::vector<OomEvent>& events_;
};

class StepRunnerTest : public testing::Test {
 protected:
  std::string dir = testing::TempDir() + "/autoaccum_runner_" + std::to_string(::getpid());
  void SetUp() override {
    ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
    options.data = {test::write_rows(dir + "/a.h5", 100, 5, 4)};
    options.global_batch = 16;
    options.steps = 2;
    options.shuffle = "none";
    options.lr = 0.1;
    options.hidden = {8};
  }
  void TearDown() override { (void)system(("rm -rf " + dir).c_str()); }

  TrainOptions options;
  test::TestComm comm{0, 1};
  std::vector<OomEvent> ooms;

  // Every room the runner uses, built as set-up builds them, and the update it takes at step 0
  // against the one computed here from the whole batch.
  void expect_first_step_equals_libtorch(std::int64_t expected_retries) {
    DataFeed feed(options, 0, 1);
    feed.expand_paths();
    feed.open(false);
    Sizing sizing(options, comm, feed);
    sizing.gather_limits(0);
    sizing.start({});
    ModelSpec spec;
    spec.hidden = options.hidden;
    spec.input_shape = {2};
    spec.outputs = 5;
    torch::manual_seed(0);
    ModelBundle bundle(make_model(spec), Objective::choose("auto", feed.reader().schema().target(),
                                                           5, options.ignore_index));
    bundle.hold_state(c10::Device(c10::kCPU), 1, 0);
    Model* model = &bundle.model();
    const ParameterSet& parameters = bundle.parameters();

    // The reference: the mean cross-entropy of batch 0 (rows 0-15), one SGD step.
    const data::Batch slab = feed.read_rank_rows(0);
    const at::Tensor loss =
        torch::nll_loss(torch::log_softmax(model->forward({slab.get("x")}), 1), slab.get("y"));
    const auto grads = torch::autograd::grad({loss}, parameters.trainable);
    std::vector<at::Tensor> expected;
    for (std::size_t i = 0; i < grads.size(); ++i)
      expected.push_back((parameters.trainable[i] - options.lr * grads[i]).detach());

    GradientExchange::Sizes sizes;
    sizes.buffer_floats = bundle.state().reduce_count();
    sizes.control_floats = StepRunner::control_floats(1);
    GradientExchange exchange(options, comm, comm, c10::Device(c10::kCPU), parameters.trainable,
                              sizes);
    exchange.choose_overlap(false);
    OptimizerStep optimizer(options, parameters.trainable);
    const Schedule schedule = make_schedule(options.lr, 0, 2, "constant");
    LossScale loss_scale(false);
    Reporter reporter;
    reporter.add(std::make_unique<Recorder>(ooms));
    const DeviceContext context;
    StepRunner runner({options, comm, context, bundle, optimizer, schedule, loss_scale, exchange,
                       sizing, feed, reporter});

    runner.probe(slab, 0);  // no limit: nothing to probe
    const StepRunner::Taken taken = runner.take(slab, 0);
    EXPECT_TRUE(taken.outcome.succeeded());
    EXPECT_FALSE(taken.update.skipped);
    EXPECT_DOUBLE_EQ(taken.update.lr, options.lr);
    EXPECT_NEAR(taken.outcome.loss, loss.item<double>(), 1e-6);
    EXPECT_EQ(taken.retries, expected_retries);
    EXPECT_EQ(runner.counts().oom_events, expected_retries);
    EXPECT_EQ(static_cast<std::int64_t>(ooms.size()), expected_retries);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const double scale = expected[i].norm().item<double>();
      EXPECT_LE((parameters.trainable[i] - expected[i]).norm().item<double>(), 1e-6 * scale)
          << "parameter " << i;
    }
  }
};

TEST_F(StepRunnerTest, AStepsUpdateEqualsTheWholeBatchsOne) {
  expect_first_step_equals_libtorch(0);
}

TEST_F(StepRunnerTest, AnOutOfMemoryRetriesTheSameBatchSmallerWithTheSameUpdate) {
  options.inject_oom = {memory::OomInjection{0, 8, std::nullopt, false}};  // above 8 rows
  expect_first_step_equals_libtorch(1);
  ASSERT_EQ(ooms.size(), 1u);
  EXPECT_EQ(ooms.front().micro_batches, (std::vector<std::int64_t>{16}));
  EXPECT_EQ(ooms.front().next, (std::vector<std::int64_t>{8}));
}

}  // namespace
}  // namespace autoaccum::train
