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
namespace {

long environment_number(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? std::strtol(value, nullptr, 10) : -1;
}

// Whether every rank of the job runs on this node, from what the launcher exported (mpirun's
// local and world sizes, or srun's node count); false when unknown.
bool job_on_one_node() {
  const long world = environment_number("OMPI_COMM_WORLD_SIZE");
  const long local = environment_number("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (world > 0 && local > 0) return world == local;
  const long step_nodes = environment_number("SLURM_STEP_NUM_NODES");
  if (step_nodes > 0) return step_nodes == 1;
  return environment_number("SLURM_NNODES") == 1;
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  // MPI_THREAD_MULTIPLE lets the collective watchdog's thread ask the other ranks which ones are
  // missing (comm/watchdog.hpp); FUNNELED is enough for everything else.
  // On one node, a thread that waits inside an MPI call yields its core instead of spinning in
  // Open MPI's progress loop: --overlap's communication thread waits there for the other ranks
  // while this rank's backward pass computes, and spinning took a core from it (2 ranks on 2
  // cores: 15-23% fewer samples per second, 1-2% when yielding). Between nodes yielding delays
  // the buckets instead (1.22-1.28x against 1.24-1.32x), so it stays off there. Open MPI turns
  // it on by itself only when a node is oversubscribed; kept when the environment sets it.
  if (job_on_one_node()) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
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
