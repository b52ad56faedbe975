// NcclCommunicator: device-memory all-reduce through NCCL, bootstrapped and controlled over MPI.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/comm/mpi_communicator.hpp"
#include "autoaccum/comm/watchdog.hpp"

namespace autoaccum::comm {

// Collective construction over `control`: every rank checks for a GPU and the ranks agree (so a
// missing GPU raises BackendUnavailable on every rank together); rank 0 makes the ncclUniqueId,
// MPI_Bcast sends it; each rank takes the GPU numbered by its node-local rank; then
// ncclCommInitRank (a failure of any kind there is agreed on and thrown on every rank). Waits poll
// ncclCommGetAsyncError and abort the communicator past nccl_wait_limit instead of hanging. Flags,
// broadcast and barrier go through `control` (host memory). NCCL running out of GPU memory for its
// own buffers is an Error with the out-of-memory exit code, not a CommError.
class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::unique_ptr<MpiCommunicator> control);
  ~NcclCommunicator() override;

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  int local_rank() const override { return control_->local_rank(); }
  int local_size() const override { return control_->local_size(); }
  const std::vector<std::string>& hosts() const override { return control_->hosts(); }
  std::string_view backend() const override { return "nccl"; }
  MemoryKind buffer_memory() const override { return MemoryKind::kDevice; }
  bool queues_collectives() const override { return true; }

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

  // The CUDA device this rank uses and the stream (a cudaStream_t) collectives run on.
  int device() const noexcept;
  void* stream() const noexcept;
  // The stream (a cudaStream_t) that writes the buffers before a collective and reads them
  // after: each all-reduce starts after the work queued on it (an event, not a device
  // synchronisation) and the work queued on it later starts after the all-reduce. Default
  // nullptr: the legacy default stream, LibTorch's default stream.
  void set_compute_stream(void* stream) noexcept;
  // Aborts the communicator without waiting for the other ranks (ncclCommAbort): for a rank
  // that leaves on its own error. The destructor does this itself while an exception unwinds.
  void abort() noexcept;

  struct Impl;  // NCCL and CUDA handles; opaque so this header needs neither nccl.h nor CUDA.

 protected:
  void do_allreduce_sum(float* data, std::size_t count, const char* what) override;
  void do_allreduce_sum(double* data, std::size_t count, const char* what) override;
  void do_queue_allreduce_sum(float* data, std::size_t count, const char* what) override;
  void do_reduce_scatter_sum(float* data, std::size_t chunk, const char* what) override;
  void do_reduce_sum(float* data, std::size_t count, int root, const char* what) override;
  void do_queue_reduce_sum(float* data, std::size_t count, int root, const char* what) override;
  void do_allgather_in_place(float* data, std::size_t chunk, const char* what) override;

 private:
  std::unique_ptr<MpiCommunicator> control_;
  std::unique_ptr<Impl> impl_;
};

// How long an NCCL wait (initialisation, an all-reduce, the final ncclCommFinalize) may last
// before the rank aborts its communicator: --collective-timeout T plus the watchdog's grace
// period plus 10 s (the watchdog ends the job first and names the missing ranks; this is its
// fallback), or no deadline when the watchdog is off (--collective-timeout 0), as for MPI.
std::optional<std::chrono::milliseconds> nccl_wait_limit(const Watchdog& dog);

// Pauses between polls of an NCCL wait: a few yields (a short all-reduce answers within
// microseconds), then sleeps doubling from 20 us to 500 us, so a rank waiting on a long
// all-reduce or a slow peer does not spin a core the prefetch thread needs.
class PollBackoff {
 public:
  static constexpr int kSpinPolls = 64;
  static constexpr std::chrono::microseconds kFirstPause{20};
  static constexpr std::chrono::microseconds kLongestPause{500};
  // The next pause (0: yield) and waits it.
  void pause();
  std::chrono::microseconds next() noexcept;

 private:
  int polls_ = 0;
  std::chrono::microseconds pause_{0};
};

// Whether this build has the NCCL communicator.
bool nccl_built() noexcept;
// "2.28.9", or "not built".
std::string nccl_version();
// CUDA devices visible to this process; 0 when there is no driver, no GPU, or no CUDA in the build.
int cuda_device_count() noexcept;

}  // namespace autoaccum::comm
