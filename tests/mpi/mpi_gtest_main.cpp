// gtest main for MPI tests: rank 0 prints, failing ranks print their failures, all ranks agree.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "autoaccum/comm/watchdog.hpp"

namespace {

// Prints failed assertions from ranks other than 0 (whose output is otherwise silenced).
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  } else {
    std::printf("MPI tests with %d ranks\n", size);
  }
  int local = RUN_ALL_TESTS();
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && global != local) {
    std::printf("FAILED on another rank (see [rank N] lines above)\n");
  }
  // Trainers under test configure the collective watchdog; its thread makes no MPI call after
  // this (as autoaccum's MpiRuntime does before MPI_Finalize).
  autoaccum::comm::watchdog().configure(autoaccum::comm::Milliseconds(0), rank);
  MPI_Finalize();
  return global;
}
