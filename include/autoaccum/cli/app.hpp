// The autoaccum command line: subcommands, their options and help.
#pragma once

#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::cli {

// Runs `autoaccum ARGS...` (args exclude the program name) on every rank of `world`.
// Returns the exit code; errors that every rank sees alike are thrown as CollectiveError.
int run_app(comm::Communicator& world, const std::vector<std::string>& args);

// Whether `autoaccum ARGS...` needs MPI: only `train` does (its help does not). The others run
// without initialising it (no MPI runtime started: instant, and usable on a login node).
bool needs_mpi(const std::vector<std::string>& args);

// The version report, one line per component; the same on every rank.
std::vector<std::string> version_lines();

}  // namespace autoaccum::cli
