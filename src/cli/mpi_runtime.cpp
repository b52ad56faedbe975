// MpiRuntime: initialise once, finalize once.
#include "autoaccum/cli/mpi_runtime.hpp"

#include <mpi.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::cli {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  // MPI_THREAD_MULTIPLE lets the collective watchdog's thread ask the other ranks which ones are
  // missing (comm/watchdog.hpp); FUNNELED is enough for everything else.
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "autoaccum: error: MPI_Init_thread failed\n");
    std::exit(2);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr,
                 "autoaccum: error: the MPI library does not provide MPI_THREAD_FUNNELED\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

MpiRuntime::~MpiRuntime() {
  const comm::Milliseconds deadline = comm::watchdog().timeout();
  comm::watchdog().configure(comm::Milliseconds(0), 0);  // its thread makes no MPI call after this
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (deadline.count() <= 0) {
    MPI_Finalize();
    return;
  }
  // MPI_Finalize waits for every rank; one that never gets there (stuck writing on a hung file
  // system, its node gone) must not keep this one until the wall-time limit: the same deadline
  // as every collective, then exit code 5 without MPI.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  std::thread guard([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (done_signal.wait_for(lock, deadline, [&] { return done; })) return;
    std::fprintf(stderr,
                 "autoaccum: rank %d: error: MPI_Finalize did not complete within %s "
                 "(--collective-timeout): another rank did not reach the end of the run\n",
                 rank, comm::duration_text(deadline).c_str());
    std::fflush(stderr);
    std::_Exit(static_cast<int>(ExitCode::kCollectiveTimeout));
  });
  MPI_Finalize();
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  done_signal.notify_all();
  guard.join();
}

}  // namespace autoaccum::cli
