// Agreement on failures: a failure on some ranks reaches every rank with the same message.
#include <gtest/gtest.h>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/mpi_communicator.hpp"

namespace autoaccum::comm {
namespace {

TEST(Agreement, NothingFailedMeansNothingToAgree) {
  MpiCommunicator comm;
  EXPECT_FALSE(agree_on_failure(comm, "").has_value());
}

TEST(Agreement, FailureOnLastRankReachesEveryRank) {
  MpiCommunicator comm;
  const int failing = comm.size() - 1;
  const std::string mine = comm.rank() == failing ? "cannot open data.h5" : "";
  auto failure = agree_on_failure(comm, mine, 3);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->rank, failing);
  EXPECT_EQ(failure->message, "cannot open data.h5");
  EXPECT_EQ(failure->exit_code, 3);
  EXPECT_EQ(failure->ranks_failed, 1);
}

TEST(Agreement, LowestFailingRankWinsAndAllAreCounted) {
  MpiCommunicator comm;
  const bool fails = comm.rank() >= 1;  // every rank but 0
  auto failure = agree_on_failure(comm, fails ? "rank " + std::to_string(comm.rank()) : "");
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->rank, 1);
  EXPECT_EQ(failure->message, "rank 1");
  EXPECT_EQ(failure->ranks_failed, comm.size() - 1);
}

TEST(Agreement, CollectivelyThrowsOnEveryRankWithTheFailingRanksMessage) {
  MpiCommunicator comm;
  const int failing = comm.size() - 1;
  try {
    collectively(comm, [&] {
      if (comm.rank() == failing) throw InputError("x has 10 rows but y has 9");
    });
    FAIL() << "every rank must throw";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(std::string(e.what()),
              "rank " + std::to_string(failing) + ": x has 10 rows but y has 9");
    EXPECT_EQ(e.exit_code(), ExitCode::kUsage);
    EXPECT_EQ(e.origin_rank(), failing);
  }
}

TEST(Agreement, CollectivelyOnEveryRankOmitsTheRank) {
  MpiCommunicator comm;
  try {
    collectively(comm, [&] { throw UsageError("--steps must be positive"); });
    FAIL() << "every rank must throw";
  } catch (const CollectiveError& e) {
    EXPECT_EQ(std::string(e.what()), "--steps must be positive");
  }
}

TEST(Agreement, CollectivelyPassesWhenNoRankFails) {
  MpiCommunicator comm;
  int ran = 0;
  EXPECT_NO_THROW(collectively(comm, [&] { ++ran; }));
  EXPECT_EQ(ran, 1);
}

}  // namespace
}  // namespace autoaccum::comm
