// Backend names and error exit codes: the contract job scripts rely on.
#include <gtest/gtest.h>

#include "autoaccum/comm/factory.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum {
namespace {

TEST(Backend, ParsesEveryName) {
  EXPECT_EQ(comm::parse_backend("auto"), comm::Backend::kAuto);
  EXPECT_EQ(comm::parse_backend("mpi"), comm::Backend::kMpi);
  EXPECT_EQ(comm::parse_backend("nccl"), comm::Backend::kNccl);
  for (auto b : {comm::Backend::kAuto, comm::Backend::kMpi, comm::Backend::kNccl}) {
    EXPECT_EQ(comm::parse_backend(comm::to_string(b)), b);
  }
}

TEST(Backend, RejectsUnknownNameNamingTheOption) {
  try {
    comm::parse_backend("gloo");
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--backend"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gloo"), std::string::npos) << e.what();
    EXPECT_EQ(e.exit_code(), ExitCode::kUsage);
  }
}

TEST(Errors, ExitCodesFollowTheContract) {
  EXPECT_EQ(static_cast<int>(UsageError("x").exit_code()), 1);
  EXPECT_EQ(static_cast<int>(InputError("x").exit_code()), 1);
  EXPECT_EQ(static_cast<int>(CommError("x").exit_code()), 2);
  EXPECT_EQ(static_cast<int>(Error("x").exit_code()), 2);
  EXPECT_EQ(static_cast<int>(Error("x", ExitCode::kOutOfMemory).exit_code()), 3);
  EXPECT_EQ(static_cast<int>(Error("x", ExitCode::kPreempted).exit_code()), 4);
  EXPECT_EQ(static_cast<int>(CollectiveTimeout("x", true).exit_code()), 5);
}

}  // namespace
}  // namespace autoaccum
