// LocalCommunicator: a process that talks to no other, for the commands that need no MPI.
#pragma once

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::comm {

// The rank and size the launcher gave this process (Open MPI's, PMIx's, PMI's or Slurm's
// environment; 0 of 1 when started alone), with collectives that combine this process's own
// values only. Commands that read or write a file once (help, version, log, inspect, import,
// synth, export) run on it without initialising MPI, so they start at once and work where no
// MPI runtime can start (a login node); under mpirun every process does the same and only rank
// 0 prints or writes.
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator();
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  const std::vector<std::string>& hosts() const override { return hosts_; }
  std::string_view backend() const override { return "none"; }
  MemoryKind buffer_memory() const override { return MemoryKind::kHost; }
  void allreduce_max(std::int64_t*, std::size_t) override {}
  void allreduce_sum(std::int64_t*, std::size_t) override {}
  void allreduce_min(std::int64_t*, std::size_t) override {}
  void allreduce_sum_host(double*, std::size_t) override {}
  void allgather(const void* send, std::size_t bytes, void* receive) override;
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}

 protected:
  void do_allreduce_sum(float*, std::size_t, const char*) override {}
  void do_allreduce_sum(double*, std::size_t, const char*) override {}

 private:
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> hosts_;
};

// The launcher's rank and size for this process, from its environment: {0, 1} when none.
struct LaunchedAs {
  int rank = 0;
  int size = 1;
};
LaunchedAs launched_as();

}  // namespace autoaccum::comm
