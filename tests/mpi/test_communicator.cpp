// MpiCommunicator against values each rank computes itself, for any world size.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "autoaccum/comm/factory.hpp"
#include "autoaccum/comm/mpi_communicator.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::comm {
namespace {

// The values rank `r` contributes: reproducible on every rank, different per rank and length.
template <class T>
std::vector<T> contribution(int r, std::size_t length) {
  std::mt19937_64 engine(1000003ULL * static_cast<unsigned>(r + 1) + length);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<T> values(length);
  for (auto& v : values)
    v = static_cast<T>(uniform(engine));
  return values;
}

// Sum over all ranks, in double, computed locally.
template <class T>
std::vector<double> expected_sum(int world, std::size_t length) {
  std::vector<double> sum(length, 0.0);
  for (int r = 0; r < world; ++r) {
    const auto values = contribution<T>(r, length);
    for (std::size_t i = 0; i < length; ++i)
      sum[i] += static_cast<double>(values[i]);
  }
  return sum;
}

template <class T>
void check_sum(Communicator& comm, std::size_t length, double tolerance) {
  auto values = contribution<T>(comm.rank(), length);
  comm.allreduce_sum(values.data(), values.size());
  const auto expected = expected_sum<T>(comm.size(), length);
  std::size_t wrong = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < length; ++i) {
    const double error = std::abs(static_cast<double>(values[i]) - expected[i]);
    worst = std::max(worst, error);
    if (error > tolerance) ++wrong;
  }
  EXPECT_EQ(wrong, 0u) << "length " << length << ", worst error " << worst;
}

class MpiComm : public testing::Test {
 protected:
  MpiCommunicator comm;
};

TEST_F(MpiComm, RankAndSizeMatchWorld) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm.rank(), rank);
  EXPECT_EQ(comm.size(), size);
  EXPECT_EQ(comm.backend(), "mpi");
  EXPECT_EQ(comm.buffer_memory(), MemoryKind::kHost);
}

TEST_F(MpiComm, SumOfFloatsForLengths0And1And1000003) {
  for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{1000003}}) {
    check_sum<float>(comm, length, 1e-5);
  }
}

TEST_F(MpiComm, SumOfDoublesForLengths0And1And1000003) {
  for (std::size_t length : {std::size_t{0}, std::size_t{1}, std::size_t{1000003}}) {
    check_sum<double>(comm, length, 1e-12);
  }
}

TEST_F(MpiComm, FlagMaxSumAndMin) {
  EXPECT_EQ(comm.allreduce_max(comm.rank()), comm.size() - 1);
  EXPECT_EQ(comm.allreduce_sum(comm.rank() + 1), comm.size() * (comm.size() + 1) / 2);
  EXPECT_EQ(comm.allreduce_min(comm.rank() + 10), 10);
  // An OOM flag raised on the last rank only reaches every rank.
  EXPECT_EQ(comm.allreduce_max(comm.rank() == comm.size() - 1 ? 1 : 0), 1);
  std::int64_t flags[3] = {comm.rank(), -comm.rank(), comm.rank() == 0 ? 7 : 0};
  comm.allreduce_max(flags, 3);
  EXPECT_EQ(flags[0], comm.size() - 1);
  EXPECT_EQ(flags[1], 0);
  EXPECT_EQ(flags[2], 7);
}

TEST_F(MpiComm, BroadcastFromEveryRoot) {
  for (int root = 0; root < comm.size(); ++root) {
    std::string text = comm.rank() == root ? "from rank " + std::to_string(root) : "junk";
    comm.broadcast(text, root);
    EXPECT_EQ(text, "from rank " + std::to_string(root));
    std::vector<double> values(5, comm.rank() == root ? 1.5 * root : -1.0);
    comm.broadcast(values.data(), values.size() * sizeof(double), root);
    for (double v : values)
      EXPECT_EQ(v, 1.5 * root);
  }
  std::string empty = comm.rank() == 0 ? "" : "not empty";
  comm.broadcast(empty, 0);
  EXPECT_TRUE(empty.empty());
}

TEST_F(MpiComm, BroadcastFromRankOutsideWorldIsAnError) {
  char byte = 0;
  EXPECT_THROW(comm.broadcast(&byte, 1, comm.size()), CommError);
}

TEST_F(MpiComm, NodeLocalRankFromHostNames) {
  // Independent of MPI_Comm_split_type: ranks on the same host, counted by processor name.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  std::vector<char> names(static_cast<std::size_t>(comm.size()) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  int local_rank = 0, local_size = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (std::string(&names[static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME]) == name) {
      ++local_size;
      if (r < comm.rank()) ++local_rank;
    }
  }
  EXPECT_EQ(comm.local_rank(), local_rank);
  EXPECT_EQ(comm.local_size(), local_size);
}

TEST_F(MpiComm, CountsDataPlaneCallsOnly) {
  std::vector<float> values(16, 1.0f);
  std::vector<double> more(16, 1.0);
  comm.allreduce_sum(values.data(), values.size());
  comm.allreduce_sum(more.data(), more.size());
  comm.allreduce_max(std::int64_t{1});
  comm.barrier();
  EXPECT_EQ(comm.data_allreduce_calls(), 2u);
}

// The sharded step's collectives (--shard optimizer), against sums computed here: every rank's
// chunk j holds values only rank r and chunk j make, so the expected sum is known everywhere.
TEST_F(MpiComm, ReduceScatterLeavesEachRankItsChunksSumInPlace) {
  const int world = comm.size();
  for (const std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{7}}) {
    std::vector<float> data(chunk * static_cast<std::size_t>(world));
    for (std::size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<float>(100 * comm.rank() + static_cast<int>(i));
    const std::uint64_t before = comm.data_allreduce_calls();
    comm.reduce_scatter_sum(data.data(), chunk, "test reduce-scatter");
    EXPECT_EQ(comm.data_allreduce_calls(), before + 1);
    for (std::size_t k = 0; k < chunk; ++k) {
      const std::size_t i = static_cast<std::size_t>(comm.rank()) * chunk + k;
      float want = 0;
      for (int r = 0; r < world; ++r)
        want += static_cast<float>(100 * r + static_cast<int>(i));
      EXPECT_EQ(data[i], want) << "chunk " << chunk << " element " << k;
    }
  }
}

// A sharded bucket reduced to each owner (--shard optimizer --overlap): the root holds the sum
// in place, counted as a reduction; every root in turn, from the communication thread's calls.
TEST_F(MpiComm, ReduceLeavesTheSumAtTheRootInPlace) {
  const int world = comm.size();
  for (int root = 0; root < world; ++root) {
    for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{9}}) {
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i)
        data[i] = static_cast<float>(1000 * comm.rank() + static_cast<int>(i));
      const std::vector<float> mine = data;
      const std::uint64_t before = comm.data_allreduce_calls();
      comm.reduce_sum(data.data(), count, root, "test reduce");
      EXPECT_EQ(comm.data_allreduce_calls(), before + 1);
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < world; ++r)
          want += static_cast<float>(1000 * r + static_cast<int>(i));
        if (comm.rank() == root)
          EXPECT_EQ(data[i], want) << "root " << root << " element " << i;
        else
          EXPECT_EQ(data[i], mine[i]) << "a non-root's values are left as they were";
      }
    }
  }
}

TEST_F(MpiComm, AllgatherInPlaceGivesEveryRankEveryChunk) {
  const int world = comm.size();
  const std::size_t chunk = 5;
  std::vector<float> data(chunk * static_cast<std::size_t>(world), -1.0f);
  for (std::size_t k = 0; k < chunk; ++k)
    data[static_cast<std::size_t>(comm.rank()) * chunk + k] =
        static_cast<float>(10 * comm.rank() + static_cast<int>(k));
  comm.allgather_in_place(data.data(), chunk);
  EXPECT_EQ(comm.data_allgather_calls(), 1u);
  for (int r = 0; r < world; ++r)
    for (std::size_t k = 0; k < chunk; ++k)
      EXPECT_EQ(data[static_cast<std::size_t>(r) * chunk + k],
                static_cast<float>(10 * r + static_cast<int>(k)));
}

TEST_F(MpiComm, CommunicatorsAreIndependentDuplicates) {
  // A second communicator must not see the first one's messages (each dups MPI_COMM_WORLD).
  MpiCommunicator other;
  EXPECT_NE(other.handle(), comm.handle());
  EXPECT_EQ(other.allreduce_sum(std::int64_t{1}), comm.size());
}

TEST(Factory, AutoWithHostBuffersIsMpi) {
  auto comm = make_communicator(Backend::kAuto, MemoryKind::kHost);
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->allreduce_sum(std::int64_t{2}), 2 * comm->size());
}

TEST(Factory, MismatchedBackendAndMemoryIsAUsageError) {
  EXPECT_THROW(make_communicator(Backend::kNccl, MemoryKind::kHost), UsageError);
  EXPECT_THROW(make_communicator(Backend::kMpi, MemoryKind::kDevice), UsageError);
}

}  // namespace
}  // namespace autoaccum::comm
