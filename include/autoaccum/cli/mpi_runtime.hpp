// MpiRuntime: MPI_Init_thread / MPI_Finalize for the lifetime of main().
#pragma once

namespace autoaccum::cli {

// Initialises MPI with MPI_THREAD_FUNNELED (only the main thread calls MPI; the prefetch thread
// reads HDF5). Finalizes in the destructor unless MPI was already finalized.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
};

}  // namespace autoaccum::cli
