// The memory module: sizes, the CPU budget (a real c10::OutOfMemoryError), OOM detection.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::memory {
namespace {

TEST(Sizes, ParsesUnits) {
  EXPECT_EQ(parse_size("96MiB"), 96LL << 20);
  EXPECT_EQ(parse_size("1.5GiB"), 3LL << 29);
  EXPECT_EQ(parse_size("512MB"), 512000000LL);
  EXPECT_EQ(parse_size("1000000"), 1000000LL);
  EXPECT_EQ(parse_size("64 kib"), 65536LL);
  EXPECT_EQ(parse_size("none"), 0);
  EXPECT_EQ(parse_size("0"), 0);
  for (const char* bad : {"", "lots", "12XB", "-5MiB", "MiB", "1e30TiB"}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--memory-limit"), std::string::npos);
    }
  }
  EXPECT_EQ(format_bytes(96LL << 20), "96.0 MiB");
  EXPECT_EQ(format_bytes(512), "512 B");
}

TEST(Budget, ThrowsTheSameOutOfMemoryErrorAsAGpuAndCountsBytes) {
  install_cpu_budget(0);
  const std::int64_t base = cpu_live_bytes();
  {
    auto t = torch::empty({1 << 20}, torch::kFloat32);  // 4 MiB
    EXPECT_GE(cpu_live_bytes() - base, 4 << 20);
    EXPECT_GE(cpu_peak_bytes(), cpu_live_bytes());
  }
  EXPECT_EQ(cpu_live_bytes(), base);
  install_cpu_budget(base + (8 << 20));
  EXPECT_NO_THROW(torch::empty({1 << 20}));
  try {
    auto big = torch::empty({4 << 20});  // 16 MiB: past the limit
    ADD_FAILURE() << "allocation past the limit succeeded";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_TRUE(is_out_of_memory(e));
    EXPECT_NE(std::string(e.what()).find("autoaccum memory limit"), std::string::npos);
  }
  EXPECT_EQ(cpu_live_bytes(), base) << "a refused allocation must not count";
  // Convolutions (whose kernels also call raw_allocate, which needs data == context) allocate
  // through the budget too: their output is counted.
  install_cpu_budget(0);
  auto conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3));
  const auto input = torch::rand({2, 1, 64, 64});
  reset_cpu_peak();
  const std::int64_t before = cpu_live_bytes();
  const auto output = conv->forward(input);
  EXPECT_GE(cpu_live_bytes() - before, static_cast<std::int64_t>(output.nbytes()));
  EXPECT_GE(cpu_peak_bytes() - before, static_cast<std::int64_t>(output.nbytes()));
}

TEST(Budget, StagingMemoryIsNeitherCountedNorLimited) {
  install_cpu_budget(0);
  const std::int64_t base = cpu_live_bytes();
  install_cpu_budget(base + (1 << 20));
  at::Tensor staged;
  {
    const UncountedScope staging;
    staged = torch::ones({4 << 20});  // 16 MiB, past the limit: host staging, allowed
  }
  EXPECT_EQ(cpu_live_bytes(), base);
  EXPECT_THROW(torch::empty({1 << 20}), c10::OutOfMemoryError) << "the scope has ended";
  EXPECT_EQ(staged.sum().item<double>(), 4 << 20);
  staged = at::Tensor();  // released through its own deleter: the count must not move
  EXPECT_EQ(cpu_live_bytes(), base);
  install_cpu_budget(0);
}

TEST(Budget, ResetPeakStartsFromLive) {
  install_cpu_budget(0);
  { auto t = torch::empty({1 << 20}); }
  ASSERT_GE(cpu_peak_bytes(), cpu_live_bytes() + (4 << 20)) << "the freed 4 MiB made a peak";
  reset_cpu_peak();
  EXPECT_EQ(cpu_peak_bytes(), cpu_live_bytes());
  const std::int64_t live = cpu_live_bytes();
  { auto t = torch::empty({1 << 18}); }  // 1 MiB: the new peak counts from live
  EXPECT_GE(cpu_peak_bytes(), live + (1 << 20));
  EXPECT_LT(cpu_peak_bytes(), live + (4 << 20)) << "the old peak is gone";
}

TEST(Detection, RecognisesOutOfMemoryMessages) {
  EXPECT_TRUE(is_out_of_memory(std::bad_alloc()));
  try {
    throw_out_of_memory("injected");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e));
  }
  try {
    TORCH_CHECK(false, "CUDA out of memory. Tried to allocate 2.00 GiB");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e)) << "older LibTorch's CUDA message";
  }
  try {
    TORCH_CHECK(false, "CUDA error: out of memory");
  } catch (const std::exception& e) {
    EXPECT_TRUE(is_out_of_memory(e));
  }
  try {
    TORCH_CHECK(false, "shape mismatch");
  } catch (const std::exception& e) {
    EXPECT_FALSE(is_out_of_memory(e));
  }
  EXPECT_FALSE(is_out_of_memory(std::runtime_error("out of memory in a message of another kind")));
}

TEST(Detection, ARefusalExplainsAnErrorThatLostItsType) {
  install_cpu_budget(0);
  install_cpu_budget(cpu_live_bytes() + (1 << 20));
  const std::runtime_error rethrown(
      "The following operation failed in the TorchScript "
      "interpreter.\nRuntimeError: something");
  {
    OomWatch watch;
    EXPECT_FALSE(watch.refused());
    EXPECT_FALSE(watch.explains(rethrown)) << "no refusal yet: a plain error is not an OOM";
    EXPECT_FALSE(watch.explains(c10::Error({__func__, __FILE__, __LINE__}, "shape mismatch")));
  }
  OomWatch watch;
  const std::int64_t before = refused_allocations();
  try {
    // The TorchScript interpreter catches the allocator's OutOfMemoryError and rethrows it as a
    // std::runtime_error with the traceback in its message; so does this.
    try {
      auto big = torch::empty({4 << 20});
    } catch (const std::exception& inner) {
      throw std::runtime_error(std::string("interpreter: ") + inner.what());
    }
    ADD_FAILURE() << "allocation past the limit succeeded";
  } catch (const std::exception& e) {
    EXPECT_FALSE(is_out_of_memory(e)) << "the type is gone";
    EXPECT_TRUE(watch.explains(e)) << "the refusal is remembered";
  }
  EXPECT_EQ(refused_allocations(), before + 1);
  EXPECT_TRUE(watch.refused());
  EXPECT_FALSE(watch.explains(UsageError("autoaccum's own decision")));
  install_cpu_budget(0);
}

TEST(Detection, CublasAndCudnnAllocationFailuresCount) {
  for (const char* message : {"CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)",
                              "cuDNN error: CUDNN_STATUS_ALLOC_FAILED"}) {
    try {
      TORCH_CHECK(false, message);
    } catch (const std::exception& e) {
      EXPECT_TRUE(is_out_of_memory(e)) << message;
    }
  }
}

TEST(Injection, ParsesAndFires) {
  const auto i = parse_oom_injections("rank=1,above=8");
  ASSERT_EQ(i.size(), 1u);
  EXPECT_TRUE(i[0].fires(1, 9, 0));
  EXPECT_FALSE(i[0].fires(1, 8, 0));
  EXPECT_FALSE(i[0].fires(0, 100, 0));
  const auto s = parse_oom_injections("rank=0,above=2,step=3");
  EXPECT_FALSE(s[0].fires(0, 5, 2));
  EXPECT_TRUE(s[0].fires(0, 5, 3));
  EXPECT_TRUE(parse_oom_injections("").empty());
  const auto several = parse_oom_injections("rank=1,above=8;rank=2,above=4,step=3");
  ASSERT_EQ(several.size(), 2u);
  EXPECT_EQ(several[1].rank, 2);
  EXPECT_EQ(several[1].step, 3);
  for (const char* bad : {"rank=1", "above=3", "rank=a,above=1", "rank=1,above=2,color=3", "rank",
                          "rank=1.5,above=2", "rank=-1,above=2"}) {
    try {
      parse_oom_injections(bad);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--inject-oom: '" + std::string(bad) + "': ", 0), 0u)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace autoaccum::memory
