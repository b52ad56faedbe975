// NcclCommunicator: a clear error on every rank without a GPU; a real all-reduce with one.
#include <gtest/gtest.h>

#include <vector>

#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/core/error.hpp"

#if AUTOACCUM_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

namespace autoaccum::comm {
namespace {

bool enough_gpus(const MpiCommunicator& control) {
  return cuda_device_count() >= control.local_size();
}

TEST(Nccl, WithoutAGpuEveryRankGetsAClearError) {
  auto control = std::make_unique<MpiCommunicator>();
  // Decide together, or ranks could disagree about entering the collective constructor.
  const bool all_have_gpus = control->allreduce_min(enough_gpus(*control) ? 1 : 0) == 1;
  if (nccl_built() && all_have_gpus) GTEST_SKIP() << "GPUs present: see RealAllReduce";
  try {
    NcclCommunicator nccl(std::move(control));
    FAIL() << "construction must fail without a GPU";
  } catch (const BackendUnavailable& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("NCCL backend unavailable"), std::string::npos) << message;
    if (nccl_built()) {
      EXPECT_TRUE(message.find("CUDA device") != std::string::npos ||
                  message.find("GPU") != std::string::npos)
          << message;
    } else {
      EXPECT_NE(message.find("built without NCCL"), std::string::npos) << message;
    }
    EXPECT_EQ(e.exit_code(), ExitCode::kUsage);
  }
}

TEST(Nccl, VersionIsReported) {
  const std::string version = nccl_version();
  if (nccl_built()) {
    EXPECT_EQ(version.find('.') != std::string::npos, true) << version;
  } else {
    EXPECT_EQ(version, "not built");
  }
}

#if AUTOACCUM_HAVE_NCCL
TEST(Nccl, RealAllReduce) {
  auto control = std::make_unique<MpiCommunicator>();
  const bool all_have_gpus = control->allreduce_min(enough_gpus(*control) ? 1 : 0) == 1;
  if (!all_have_gpus) GTEST_SKIP() << "needs one GPU per rank";
  NcclCommunicator nccl(std::move(control));
  const std::size_t n = 1000003;
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i)
    host[i] = static_cast<float>((nccl.rank() + 1) * (i % 7));
  void* memory = nullptr;
  ASSERT_EQ(cudaMalloc(&memory, n * sizeof(float)), cudaSuccess);
  auto* device = static_cast<float*>(memory);
  ASSERT_EQ(cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  nccl.allreduce_sum(device, n);
  ASSERT_EQ(cudaMemcpy(host.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(device);
  const float ranks_sum = static_cast<float>(nccl.size() * (nccl.size() + 1) / 2);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    wrong += host[i] != ranks_sum * static_cast<float>(i % 7);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(nccl.data_allreduce_calls(), 1u);
}
#endif

}  // namespace
}  // namespace autoaccum::comm
