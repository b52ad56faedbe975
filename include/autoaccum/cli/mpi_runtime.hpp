// MpiRuntime: MPI_Init_thread / MPI_Finalize for the lifetime of main().
#pragma once

namespace autoaccum::cli {

// Initialises MPI asking for MPI_THREAD_MULTIPLE: the main thread makes every collective; the
// collective watchdog's thread (comm/watchdog.hpp) talks to the other ranks' only while one is
// late; the prefetch thread reads HDF5. FUNNELED is the least it accepts (the watchdog then
// cannot name missing ranks). Stops the watchdog's thread and finalizes in the destructor unless
// MPI was already finalized.
class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
};

}  // namespace autoaccum::cli
