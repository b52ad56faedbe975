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

}  // namespace
}  // namespace autoaccum::io
