// MpiRuntime: initialise once, finalize once.
#include "autoaccum/cli/mpi_runtime.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "autoaccum/comm/watchdog.hpp"

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
  comm::watchdog().configure(comm::Milliseconds(0), 0);  // its thread makes no MPI call after this
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace autoaccum::cli
