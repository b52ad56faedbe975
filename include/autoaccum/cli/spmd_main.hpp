// spmd_main: the top of every autoaccum process, which makes all ranks leave together.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::cli {

// Initialises MPI, builds the world communicator and runs `body` on every rank with the
// command-line arguments after the program name (as left by MPI_Init_thread).
//  - body returns: every rank returns that code.
//  - body throws CollectiveError (every rank threw it together, see comm::collectively): rank 0
//    prints the message once and every rank returns its exit code after MPI_Finalize.
//  - body throws CollectiveTimeout (a rank did not reach a collective in time): the rank chosen
//    to report prints the line and MPI_Abort ends the job with exit code 5.
//  - any other exception: only this rank knows, and the others may be waiting in a collective,
//    so the rank prints "rank R: ..." and calls MPI_Abort with the error's exit code, which ends
//    every rank of the job.
using SpmdBody =
    std::function<int(comm::Communicator& world, const std::vector<std::string>& args)>;
// `needs_mpi(args)` false: MPI is not initialised at all; `body` runs on a LocalCommunicator
// (every process alone, rank 0 of the launcher prints), errors print from that rank 0 and return
// their exit code. Without a predicate every command needs MPI.
using NeedsMpi = std::function<bool(const std::vector<std::string>& args)>;
int spmd_main(int argc, char** argv, const SpmdBody& body, const NeedsMpi& needs_mpi = nullptr);

}  // namespace autoaccum::cli
