// The trainer on a GPU: a real CUDA out-of-memory under --memory-limit recovered by halving, and
// one step's gradient equal between CPU and GPU. Every test skips itself where this build has
// no CUDA or the machine no GPU (jobs/gpu-check.sh runs them on a GPU machine).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "../mpi/shared_synth.hpp"
#include "autoaccum/comm/mpi_communicator.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/data/importers.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/trainer.hpp"

namespace autoaccum::train {
namespace {

class GpuTrainerTest : public testing::Test {
 protected:
  comm::MpiCommunicator world;
  std::optional<test_support::SharedSynthFile> shared;
  std::string dir;
  std::string data;

  void SetUp() override {
    const bool gpus = world.allreduce_min(memory::cuda_devices().count > 0 ? 1 : 0) == 1;
    if (!memory::cuda_built()) GTEST_SKIP() << "built without CUDA (no CUDA LibTorch found)";
    if (!gpus) GTEST_SKIP() << "no GPU visible on every rank";
    data::SynthOptions o;
    o.rows = 8192;
    o.features = 784;
    o.classes = 10;
    o.seed = 5;
    shared.emplace(world, o);
    dir = shared->dir();
    data = shared->path();
  }
  void TearDown() override { shared.reset(); }

  TrainOptions base(std::int64_t global_batch, std::int64_t steps) const {
    TrainOptions o;
    o.data = {data};
    o.device = "cuda";
    o.hidden = {512, 512};
    o.global_batch = global_batch;
    o.steps = steps;
    o.shuffle = "batch";
    o.lr = 0.05;
    o.momentum = 0.9;
    o.seed = 11;
    o.log_every = 0;
    o.quiet = true;
    return o;
  }
};

TEST_F(GpuTrainerTest, OneStepGradientEqualsTheCpuGradient) {
  TrainOptions o = base(512 * world.size(), 1);
  o.micro_batch = 64;
  at::Tensor gpu, cpu;
  {
    Trainer t(o, world);
    t.run();
    gpu = t.last_gradient().to(at::kCPU);
  }
  o.device = "cpu";
  o.threads = 1;
  {
    Trainer t(o, world);
    t.run();
    cpu = t.last_gradient();
  }
  ASSERT_EQ(gpu.numel(), cpu.numel());
  const double scale = cpu.abs().max().item<double>();
  ASSERT_GT(scale, 0);
  const double error = (gpu - cpu).abs().max().item<double>() / scale;
  EXPECT_LT(error, 1e-4) << "max |gpu - cpu| / max |cpu|";
}

TEST_F(GpuTrainerTest, ARealCudaOutOfMemoryIsRecoveredByHalving) {
  // Wide layers: activations grow with the micro-batch much faster than the fixed state.
  const std::int64_t batch = 4096 * world.size();
  auto peak_at = [&](std::int64_t m) {
    TrainOptions o = base(batch, 1);
    o.hidden = {4096, 4096};
    o.micro_batch = m;
    Trainer t(o, world);
    t.run();
    return world.allreduce_max(memory::peak_bytes());
  };
  const std::int64_t full = peak_at(4096);
  const std::int64_t small = peak_at(256);
  ASSERT_GT(full, small);
  TrainOptions o = base(batch, 3);
  o.hidden = {4096, 4096};
  o.memory_limit = (full + small) / 2;  // 4096 cannot fit; 256 can
  o.predict_micro_batch = false;        // the halving search: a real CUDA OOM, recovered
  o.run_log = dir + "/gpu-oom.h5";
  TrainResult r;
  {
    Trainer t(o, world);
    r = t.run();
  }
  EXPECT_GT(r.oom_events, 0) << "the limit should have caused a real CUDA OOM";
  EXPECT_LT(r.final_micro_batch, 4096);
  EXPECT_GE(r.final_micro_batch, 256);
  EXPECT_EQ(r.steps_done, 3);
  if (world.rank() == 0) {
    const auto log = io::read_run_log(o.run_log);
    for (double peak : log.column("ranks", "peak_bytes")->values)
      EXPECT_LE(peak, static_cast<double>(o.memory_limit));
    EXPECT_GT(log.column("oom", "rank")->values.size(), 0u);
  }
}

// --precision bf16 and fp16 on a GPU: the step's gradient against the CPU's fp32 one, within the
// rounding of 8 (bf16) or 11 (fp16) significant bits of each product.
at::Tensor one_step_gradient(TrainOptions o, comm::Communicator& world) {
  Trainer t(o, world);
  t.run();
  return t.last_gradient().to(at::kCPU);
}

double relative_error(const at::Tensor& a, const at::Tensor& reference) {
  return (a - reference).abs().max().item<double>() / reference.abs().max().item<double>();
}

TEST_F(GpuTrainerTest, Bf16AndFp16GradientsAreCloseToTheFp32Gradient) {
  TrainOptions o = base(512 * world.size(), 1);
  o.micro_batch = 48;  // does not divide 512
  const at::Tensor fp32 = one_step_gradient(o, world);
  o.precision = Precision::kBf16;
  const at::Tensor bf16 = one_step_gradient(o, world);
  o.precision = Precision::kFp16;
  const at::Tensor fp16 = one_step_gradient(o, world);
  EXPECT_LT(relative_error(bf16, fp32), 3e-2);
  EXPECT_LT(relative_error(fp16, fp32), 5e-3);
  EXPECT_GT(relative_error(bf16, fp32), 0) << "bf16 must not compute in fp32";
}

TEST_F(GpuTrainerTest, Fp16SkipsAnInjectedOverflowOnEveryRankAndHalvesTheScale) {
  TrainOptions o = base(512 * world.size(), 4);
  o.precision = Precision::kFp16;
  o.inject_overflow = {OverflowInjection{world.size() - 1, 1}};
  o.run_log = dir + "/gpu-fp16.h5";
  TrainResult r;
  {
    Trainer t(o, world);
    r = t.run();
  }
  EXPECT_EQ(r.steps_done, 4);
  EXPECT_EQ(r.overflow_steps, 1);
  if (world.rank() == 0) {
    const auto log = io::read_run_log(o.run_log);
    const auto& scale = log.column("steps", "loss_scale")->values;
    ASSERT_EQ(scale.size(), 4u);
    // The loss sums 512 rows per rank: the scale starts at 2^16 / 512.
    EXPECT_EQ(scale[1], 128.0);
    EXPECT_EQ(scale[2], 64.0);
    EXPECT_EQ(log.column("steps", "skipped")->values[1], 1.0);
  }
}

// docs/gpu.md: a checkpoint written on the CPU resumes on a GPU. It holds the CPU's random stream
// alone; the GPU's starts from the seed instead of failing as "too short".
TEST_F(GpuTrainerTest, ACheckpointWrittenOnTheCpuResumesOnTheGpu) {
  TrainOptions o = base(256 * world.size(), 2);
  o.device = "cpu";
  o.checkpoint = dir + "/gpu-resume.ckpt";
  {
    Trainer t(o, world);
    EXPECT_EQ(t.run().steps_done, 2);
  }
  o.device = "cuda";
  o.steps = 4;
  o.resume = true;
  Trainer t(o, world);
  const TrainResult r = t.run();
  EXPECT_EQ(r.steps_done, 4);
  EXPECT_TRUE(std::isfinite(r.final_loss));
}

// --overlap on with NCCL (docs/design.md, "Overlapped all-reduce"): the buckets are queued on
// NCCL's stream by autograd's device thread during the last backward pass, the tail's wait
// completes them. With an out-of-memory injected in that backward pass (the buckets already
// queued, the rest sent at the attempt's end, the attempt dropped on every rank), the run equals
// the one collective's: bit for bit at one rank (a one-GPU machine: NCCL refuses two ranks on a
// GPU), to the last bits of NCCL's summation order with more.
TEST_F(GpuTrainerTest, OverlapQueuedOnNcclsStreamEqualsTheOneCollective) {
  if (!comm::nccl_built()) GTEST_SKIP() << "built without NCCL";
  TrainOptions o = base(512 * world.size(), 4);
  o.micro_batch = 128;
  o.predict_micro_batch = false;
  o.bucket_mib = 0.25;  // 784 x 512 floats make a bucket of their own; several buckets
  o.inject_oom = {memory::OomInjection{world.size() - 1, 64, 1, true}};
  const auto train = [&](const std::string& overlap) {
    o.overlap = overlap;
    o.run_log = dir + "/gpu-overlap-" + overlap + ".h5";
    Trainer t(o, world);
    const TrainResult r = t.run();
    EXPECT_EQ(r.steps_done, 4) << overlap;
    EXPECT_GT(r.oom_events, 0) << overlap;
    EXPECT_EQ(r.final_micro_batch, 64) << overlap;
    std::vector<at::Tensor> parameters;
    for (const auto& p : t.model().parameters())
      parameters.push_back(p.detach().to(at::kCPU));
    return parameters;
  };
  const auto off = train("off");
  const auto on = train("on");
  if (world.rank() == 0) {
    const auto log = io::read_run_log(dir + "/gpu-overlap-on.h5");
    EXPECT_NE(log.attribute("overlap").find("queued on NCCL's stream"), std::string::npos)
        << log.attribute("overlap");
    EXPECT_GT(std::stod(log.attribute("gradient_buckets", "0")), 1);
  }
  ASSERT_EQ(on.size(), off.size());
  for (std::size_t i = 0; i < on.size(); ++i) {
    if (world.size() == 1)
      EXPECT_TRUE(torch::equal(on[i], off[i])) << "parameter " << i;
    else
      EXPECT_LE(relative_error(on[i], off[i]), 1e-6) << "parameter " << i;
  }
}

// --shard optimizer on GPUs: the gradients reduce-scattered (or, with --overlap on, buckets
// queued as ncclReduce to their owners on NCCL's stream during the last backward pass), the
// step's control values all-reduced after them and the parameters all-gathered on NCCL's
// communicator: an out-of-memory on the last rank halves every rank, and the parameters equal
// the unsharded run's, with AdamW and clipping. --shard gradients: every micro-batch's buckets
// reduced to their owners (blocking ncclReduce from autograd's thread), the same parameters.
TEST_F(GpuTrainerTest, ShardedOnNcclEqualsTheUnshardedRun) {
  if (!comm::nccl_built()) GTEST_SKIP() << "built without NCCL";
  TrainOptions o = base(512 * world.size(), 4);
  o.micro_batch = 128;
  o.predict_micro_batch = false;
  o.optimizer = "adamw";
  o.lr = 0.001;
  o.weight_decay = 0.1;
  o.clip_grad_norm = 0.5;
  o.bucket_mib = 0.01;
  o.inject_oom = {memory::OomInjection{world.size() - 1, 64, 1, false}};
  const auto train = [&](const std::string& shard, const std::string& overlap) {
    o.shard = shard;
    o.overlap = overlap;
    o.run_log = dir + "/gpu-shard-" + shard + "-" + overlap + ".h5";
    Trainer t(o, world);
    const TrainResult r = t.run();
    EXPECT_EQ(r.steps_done, 4) << shard << " " << overlap;
    EXPECT_EQ(r.final_micro_batch, 64) << shard << " " << overlap;
    std::vector<at::Tensor> parameters;
    for (const auto& p : t.model().parameters())
      parameters.push_back(p.detach().to(at::kCPU));
    return parameters;
  };
  const auto whole = train("none", "off");
  const auto sharded = train("optimizer", "off");
  const auto bucketed = train("optimizer", "on");
  const auto sliced = train("gradients", "off");  // every micro-batch's buckets: ncclReduce
  if (world.rank() == 0 && world.size() > 1) {
    const auto log = io::read_run_log(dir + "/gpu-shard-optimizer-off.h5");
    EXPECT_EQ(log.attribute("shard"), "optimizer");
    const auto overlapped = io::read_run_log(dir + "/gpu-shard-optimizer-on.h5");
    EXPECT_NE(overlapped.attribute("overlap").find("reduced to the ranks owning each slice"),
              std::string::npos)
        << overlapped.attribute("overlap");
    EXPECT_NE(overlapped.attribute("overlap").find("queued on NCCL's stream"), std::string::npos)
        << overlapped.attribute("overlap");
    EXPECT_EQ(io::read_run_log(dir + "/gpu-shard-gradients-off.h5").attribute("shard"),
              "gradients");
  }
  ASSERT_EQ(sharded.size(), whole.size());
  ASSERT_EQ(bucketed.size(), whole.size());
  for (std::size_t i = 0; i < sharded.size(); ++i) {
    EXPECT_LE(relative_error(sharded[i], whole[i]), 1e-6) << "parameter " << i;
    EXPECT_LE(relative_error(bucketed[i], whole[i]), 1e-6) << "parameter " << i << " (overlap)";
    EXPECT_LE(relative_error(sliced[i], whole[i]), 1e-6) << "parameter " << i << " (gradients)";
  }
}

}  // namespace
}  // namespace autoaccum::train
