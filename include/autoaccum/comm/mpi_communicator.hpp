// MpiCommunicator: the host-memory Communicator over a private duplicate of an MPI communicator.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::comm {

class WatchChannel;

// Owns duplicates of `parent` (default MPI_COMM_WORLD) and of its node-local split, both set to
// MPI_ERRORS_RETURN so that every failure becomes a CommError naming the call and the rank.
// Every collective is watched by the process's watchdog (comm/watchdog.hpp) once it has a
// timeout. Where MPI gives MPI_THREAD_MULTIPLE the first one made in a process is also the
// watchdog's channel to the other ranks (a third private duplicate, point to point only).
// Not movable: collectives in flight hold its handles. The destructor frees them and never throws.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm parent = MPI_COMM_WORLD);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string_view backend() const override { return "mpi"; }
  MemoryKind buffer_memory() const override { return MemoryKind::kHost; }

  using Communicator::allreduce_max;
  using Communicator::allreduce_min;
  using Communicator::allreduce_sum;
  using Communicator::broadcast;
  void allreduce_max(std::int64_t* values, std::size_t count) override;
  void allreduce_sum(std::int64_t* values, std::size_t count) override;
  void allreduce_min(std::int64_t* values, std::size_t count) override;
  void allreduce_sum_host(double* values, std::size_t count) override;
  void allgather(const void* send, std::size_t bytes, void* receive) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;

  MPI_Comm handle() const noexcept { return comm_; }
  bool collectives_from_any_thread() const override { return any_thread_; }
  // Every rank's host (MPI_Get_processor_name, at most 63 characters), by rank.
  const std::vector<std::string>& hosts() const override { return hosts_; }

 protected:
  void do_allreduce_sum(float* data, std::size_t count, const char* what) override;
  void do_allreduce_sum(double* data, std::size_t count, const char* what) override;
  void do_reduce_scatter_sum(float* data, std::size_t chunk, const char* what) override;
  void do_reduce_sum(float* data, std::size_t count, int root, const char* what) override;
  void do_allgather_in_place(float* data, std::size_t chunk, const char* what) override;

 private:
  void allreduce(void* data, std::size_t count, MPI_Datatype type, std::size_t type_bytes,
                 MPI_Op op, const char* what);

  std::vector<std::string> hosts_;
  std::unique_ptr<WatchChannel> channel_;  // the watchdog's messages; null without THREAD_MULTIPLE

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool any_thread_ = false;  // MPI_THREAD_SERIALIZED or more was provided
};

// Throws CommError naming `call` and the MPI error string when `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* call);

}  // namespace autoaccum::comm
