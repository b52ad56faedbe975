// Checkpoint files: a newest one that cannot be read, for any reason, gives way to the previous.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::io {
namespace {

Checkpoint with_parameter(std::int64_t step, std::int64_t elements) {
  Checkpoint c;
  c.step = step;
  c.micro_batch = 8;
  c.params.emplace_back("w", torch::full({elements}, static_cast<float>(step)));
  return c;
}

TEST(Checkpoint, ANewestThatRunsOutOfMemoryWhileReadFallsBackToThePrevious) {
  const std::string path = "/tmp/autoaccum-unit-ckpt-" + std::to_string(::getpid()) + ".h5";
  write_checkpoint(path, with_parameter(3, 1000));     // becomes the previous one
  write_checkpoint(path, with_parameter(4, 4 << 20));  // 16 MiB of parameters
  ASSERT_EQ(read_checkpoint(path).step, 4) << "both files are whole";

  // A budget too small for the newest file's tensor (as a small --memory-limit would be):
  // LibTorch's allocation fails inside the read, which is not one of autoaccum's own errors.
  memory::install_cpu_budget(0);
  memory::install_cpu_budget(memory::cpu_live_bytes() + (1 << 20));
  std::optional<LoadedCheckpoint> loaded;
  EXPECT_NO_THROW(loaded = read_latest_checkpoint(path));
  memory::install_cpu_budget(0);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->path, previous_checkpoint_path(path));
  EXPECT_EQ(loaded->checkpoint.step, 3);
  EXPECT_EQ(loaded->checkpoint.params.at(0).second[999].item<float>(), 3.0f);
  EXPECT_NE(loaded->warning.find("newest checkpoint is unreadable"), std::string::npos)
      << loaded->warning;
  EXPECT_NE(loaded->warning.find("memory limit"), std::string::npos) << loaded->warning;
  std::remove(path.c_str());
  std::remove(previous_checkpoint_path(path).c_str());
}

TEST(Checkpoint, TensorsOfEveryKindAndAStreamedOptimizerRoundTrip) {
  // A bfloat16 tensor stored as float32 (18 MB: written in 8 MiB pieces of rows), a transposed
  // (not contiguous) one, a bool one, a scalar; optimizer bytes streamed in uneven pieces.
  const std::string path = "/tmp/autoaccum-unit-kinds-" + std::to_string(::getpid()) + ".h5";
  torch::manual_seed(1);
  const at::Tensor big = torch::randn({3000, 1500}).to(torch::kBFloat16);
  const at::Tensor transposed = torch::randn({40, 30}).t();
  const at::Tensor flags = torch::rand({17}) > 0.5;
  const at::Tensor scalar = torch::tensor(2.5, torch::kDouble);
  Checkpoint c;
  c.step = 7;
  c.params = {{"big", big}, {"transposed", transposed}, {"flags", flags}, {"scalar", scalar}};
  std::string bytes(300007, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>((i * 7919) % 251);
  int calls = 0;
  c.stream_optimizer = [&](const ByteSink& sink) {
    ++calls;
    std::size_t at = 0;
    for (std::size_t piece : {std::size_t{1}, std::size_t{100000}, std::size_t{200006}}) {
      ASSERT_EQ(sink(bytes.data() + at, piece), piece);
      at += piece;
    }
  };
  const std::int64_t written = write_checkpoint(path, c);
  EXPECT_EQ(calls, 2) << "measured, then written";
  EXPECT_GT(written, 3000 * 1500 * 4);
  const Checkpoint back = read_checkpoint(path);
  ASSERT_EQ(back.params.size(), 4u);
  EXPECT_TRUE(torch::equal(back.params[0].second, big.to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(back.params[1].second, transposed));
  EXPECT_TRUE(torch::equal(back.params[2].second, flags.to(torch::kByte)));
  EXPECT_EQ(back.params[3].second.item<double>(), 2.5);
  EXPECT_EQ(back.optimizer, bytes);
  std::remove(path.c_str());
}

TEST(Checkpoint, MemoryModelsRoundTripPerRankAndOlderFilesHaveNone) {
  const std::string path = "/tmp/autoaccum-unit-memory-" + std::to_string(::getpid()) + ".h5";
  Checkpoint c;
  c.params = {{"w", torch::ones({2})}};
  c.world_size = 3;
  // Rank 1 has no point yet; the values keep every bit (float64).
  c.memory_models = {{{1.0 / 3, 2.0 / 7, 123456789.125, 64, 4096, 987654321.5}, 96, 3e6, 0.01 / 3},
                     {{}, 0, 0, 0},
                     {{8, 0, 1048576.75}, 0, 1e6, 0}};
  write_checkpoint(path, c);
  const Checkpoint back = read_checkpoint(path);
  ASSERT_EQ(back.memory_models.size(), 3u);
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(back.memory_models[r].points, c.memory_models[r].points) << "rank " << r;
    EXPECT_EQ(back.memory_models[r].failed_units, c.memory_models[r].failed_units);
    EXPECT_EQ(back.memory_models[r].base, c.memory_models[r].base);
    EXPECT_EQ(back.memory_models[r].width_ratio, c.memory_models[r].width_ratio);
  }
  c.memory_models.clear();  // a fixed micro-batch, or a checkpoint from before they were kept
  write_checkpoint(path, c);
  EXPECT_TRUE(read_checkpoint(path).memory_models.empty());
  std::remove(path.c_str());
  std::remove(previous_checkpoint_path(path).c_str());
}

TEST(Checkpoint, PerRankSizesAndSharesRoundTripAndAnAbsentListReadsEmpty) {
  const std::string path = "/tmp/autoaccum-unit-shares-" + std::to_string(::getpid()) + ".h5";
  Checkpoint c;
  c.params = {{"w", torch::ones({2})}};
  c.world_size = 3;
  c.micro_batches = {40, 7, 40};
  c.shares = {50, 7, 63};
  c.shares_after = {52, 6, 62};
  c.shares_followed = {40, 40, 40};
  write_checkpoint(path, c);
  Checkpoint back = read_checkpoint(path);
  EXPECT_EQ(back.micro_batches, c.micro_batches);
  EXPECT_EQ(back.shares, c.shares);
  EXPECT_EQ(back.shares_after, c.shares_after);
  EXPECT_EQ(back.shares_followed, c.shares_followed);
  c.shares_followed.clear();  // no automatic size followed the shares, or an older checkpoint
  write_checkpoint(path, c);
  back = read_checkpoint(path);
  EXPECT_TRUE(back.shares_followed.empty());
  EXPECT_EQ(back.shares, c.shares);
  std::remove(path.c_str());
  std::remove(previous_checkpoint_path(path).c_str());
}

}  // namespace
}  // namespace autoaccum::io
