// spmd_main: one place that decides how a failing rank takes the others down with it.
#include "autoaccum/cli/spmd_main.hpp"

#include <c10/util/Exception.h>
#include <hdf5.h>
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <thread>

#include "autoaccum/cli/mpi_runtime.hpp"
#include "autoaccum/comm/local_communicator.hpp"
#include "autoaccum/comm/mpi_communicator.hpp"
#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/console.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::cli {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void abort_job(const char* what, ExitCode code) {
  std::cerr.flush();
  core::write_line(stderr, "autoaccum: rank " + std::to_string(world_rank()) + ": error: " + what);
  MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  std::_Exit(static_cast<int>(code));  // MPI_Abort does not return; be sure.
}

}  // namespace

// A command that needs no MPI: one process alone; its errors are its own.
int local_main(const std::vector<std::string>& args, const SpmdBody& body) {
  comm::LocalCommunicator world;
  try {
    return body(world, args);
  } catch (const CollectiveError& e) {
    // Rank 0 says it and its exit code is the job's. The others leave with 0: without a
    // barrier, a non-zero exit of theirs could make the launcher kill rank 0 before its line.
    if (world.rank() != 0) return 0;
    core::write_line(stderr, std::string("autoaccum: error: ") + e.what());
    return static_cast<int>(e.exit_code());
  } catch (const Error& e) {
    core::write_line(stderr, std::string("autoaccum: error: ") + e.what());
    return static_cast<int>(e.exit_code());
  } catch (const c10::Error& e) {
    core::write_line(stderr, std::string("autoaccum: error: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    core::write_line(stderr, std::string("autoaccum: error: ") + e.what());
  }
  return static_cast<int>(ExitCode::kInternal);
}

int spmd_main(int argc, char** argv, const SpmdBody& body, const NeedsMpi& needs_mpi) {
  // Past a file-size limit (ulimit -f, some quotas) a write then fails with EFBIG and is
  // reported like a full disk, instead of the kernel killing the rank.
  std::signal(SIGXFSZ, SIG_IGN);
  // HDF5's own clean-up at exit would close, again, a file whose close already failed (a full
  // disk) and crash; every file autoaccum writes is closed explicitly before then.
  H5dont_atexit();
  if (needs_mpi) {
    const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
    if (!needs_mpi(args)) return local_main(args, body);
  }
  MpiRuntime mpi(&argc, &argv);
  int code = 0;
  {
    std::unique_ptr<comm::MpiCommunicator> world;
    try {
      world = std::make_unique<comm::MpiCommunicator>();
      const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
      code = body(*world, args);
    } catch (const CollectiveError& e) {
      // Every rank knows the failure; rank 0 says it once. The barrier keeps the other ranks'
      // non-zero exits (which make the launcher end the job) behind that line.
      if (world_rank() == 0) core::write_line(stderr, std::string("autoaccum: error: ") + e.what());
      code = static_cast<int>(e.exit_code());
      try {
        if (world) world->barrier();
      } catch (const std::exception&) {
      }
    } catch (const CollectiveTimeout& e) {
      // Some rank will never come back (comm/watchdog.hpp), so MPI_Finalize could hang: the one
      // rank chosen to report says the line, and MPI_Abort ends every rank the launcher still
      // reaches. The others give it a moment, so that its line (and rank 0's run log) comes first.
      if (e.reporter())
        core::write_line(stderr, std::string("autoaccum: error: ") + e.what());
      else
        std::this_thread::sleep_for(comm::kNonReporterAbortDelay);  // one abort (watchdog.cpp)
      MPI_Abort(MPI_COMM_WORLD, static_cast<int>(e.exit_code()));
      std::_Exit(static_cast<int>(e.exit_code()));
    } catch (const Error& e) {
      abort_job(e.what(), e.exit_code());
    } catch (const c10::Error& e) {
      abort_job(e.what_without_backtrace(), ExitCode::kInternal);
    } catch (const std::exception& e) {
      abort_job(e.what(), ExitCode::kInternal);
    } catch (...) {
      abort_job("unknown exception", ExitCode::kInternal);
    }
  }
  return code;
}

}  // namespace autoaccum::cli
