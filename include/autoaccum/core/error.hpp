// Typed errors shared by every module; each carries the process exit code it should end with.
#pragma once

#include <stdexcept>
#include <string>

namespace autoaccum {

// Exit codes are a contract with job scripts (architecture.md, "Exit codes").
enum class ExitCode : int {
  kOk = 0,
  kUsage = 1,              // bad command line, config or input data
  kInternal = 2,           // a bug or an unexpected library failure
  kOutOfMemory = 3,        // does not fit even at micro-batch 1
  kPreempted = 4,          // stopped by a signal after writing a checkpoint
  kCollectiveTimeout = 5,  // a collective passed --collective-timeout (a rank or link is gone)
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ExitCode code = ExitCode::kInternal)
      : std::runtime_error(message), code_(code) {}
  ExitCode exit_code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

// A bad option, option value or config file.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message, ExitCode::kUsage) {}
};

// Input that cannot be used: a missing file, a bad dataset, a label out of range.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(message, ExitCode::kUsage) {}
};

// A failed MPI or NCCL call, or a collective that did not complete.
class CommError : public Error {
 public:
  explicit CommError(const std::string& message) : Error(message, ExitCode::kInternal) {}
};

// The requested communicator backend cannot run here (no GPU, NCCL not built).
class BackendUnavailable : public Error {
 public:
  explicit BackendUnavailable(const std::string& message) : Error(message, ExitCode::kUsage) {}
};

// A collective that did not complete within the deadline (comm/watchdog.hpp). Some ranks may
// never come back, so the process ends through MPI_Abort, not MPI_Finalize; `reporter` is true
// on the one rank (of those that could still talk) that says the line.
class CollectiveTimeout : public Error {
 public:
  CollectiveTimeout(const std::string& message, bool reporter)
      : Error(message, ExitCode::kCollectiveTimeout), reporter_(reporter) {}
  bool reporter() const noexcept { return reporter_; }

 private:
  bool reporter_;
};

// An error that every rank raised together with the same message, so the ranks can leave
// through MPI_Finalize instead of MPI_Abort; only rank 0 prints it.
class CollectiveError : public Error {
 public:
  CollectiveError(const std::string& message, ExitCode code, int origin_rank)
      : Error(message, code), origin_rank_(origin_rank) {}
  int origin_rank() const noexcept { return origin_rank_; }

 private:
  int origin_rank_;
};

}  // namespace autoaccum
