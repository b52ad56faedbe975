// The Communicator interface: the collectives autoaccum's training step needs, backend-neutral.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace autoaccum::comm {

// Where the buffers handed to the data-plane all-reduce live.
enum class MemoryKind { kHost, kDevice };

// A communicator has two planes:
//  - the data plane (`allreduce_sum` of float/double buffers): host memory for MPI, device
//    memory for NCCL; each call is counted, so tests can assert one gradient collective per step;
//  - the control plane (flags, broadcast, barrier): always host memory, always MPI.
// Every collective must be entered by every rank of the communicator, in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank and size among the ranks on this node (MPI_COMM_TYPE_SHARED).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // Every rank's host name, by rank (gathered once, when the communicator is made).
  virtual const std::vector<std::string>& hosts() const = 0;
  virtual std::string_view backend() const = 0;
  virtual MemoryKind buffer_memory() const = 0;

  // Data plane: in-place sum over ranks of `count` elements at `data`. `what`, when given, names
  // the collective in a timeout's message (a static string: "gradient bucket 3 of 7").
  void allreduce_sum(float* data, std::size_t count, const char* what = nullptr);
  void allreduce_sum(double* data, std::size_t count, const char* what = nullptr);
  // Whether the collectives may be called from a thread other than the one that initialised
  // the library (one thread at a time): MPI_THREAD_SERIALIZED or more. --overlap needs it.
  virtual bool collectives_from_any_thread() const { return true; }
  // Whether the data plane can queue a sum without waiting for it (queue_allreduce_sum): NCCL,
  // whose collectives run on a stream of their own in the order they were issued. --overlap
  // on a GPU sends its buckets so, from the autograd thread that completes them.
  virtual bool queues_collectives() const { return false; }
  // Data plane: an in-place sum that starts after the work already queued on the device (the
  // gradients that the caller saw accumulated) and returns before it completes; the next
  // allreduce_sum, which waits, is issued after it and so completes it first. Counted as a
  // data-plane call. Backends that cannot queue (the default) sum at once, as allreduce_sum.
  void queue_allreduce_sum(float* data, std::size_t count, const char* what = nullptr);

  // Data plane, for sharded state (--shard optimizer). `data` holds size() chunks of `chunk`
  // floats each, in rank order.
  // reduce_scatter_sum: afterwards this rank's chunk (rank() * chunk onwards) holds the sum over
  // ranks of that chunk; the other chunks hold unspecified values. Counted as a reduction (the
  // step's one gradient collective), like an all-reduce.
  void reduce_scatter_sum(float* data, std::size_t chunk, const char* what = nullptr);
  // reduce_sum: afterwards `root`'s `count` floats at `data` hold the sum over ranks of theirs;
  // the other ranks' are unspecified. A bucket of a sharded gradient goes so to the rank (or
  // ranks, one call each) owning its elements. Counted as a reduction. queue_reduce_sum is its
  // queued form (as queue_allreduce_sum; backends that cannot queue reduce at once).
  void reduce_sum(float* data, std::size_t count, int root, const char* what = nullptr);
  void queue_reduce_sum(float* data, std::size_t count, int root, const char* what = nullptr);
  // allgather_in_place: every rank's own chunk is copied into the same chunk on every rank.
  // Counted apart (data_allgather_calls).
  void allgather_in_place(float* data, std::size_t chunk, const char* what = nullptr);

  // Control plane: in-place element-wise max / sum / min of small host integer arrays.
  virtual void allreduce_max(std::int64_t* values, std::size_t count) = 0;
  virtual void allreduce_sum(std::int64_t* values, std::size_t count) = 0;
  virtual void allreduce_min(std::int64_t* values, std::size_t count) = 0;
  std::int64_t allreduce_max(std::int64_t value);
  std::int64_t allreduce_sum(std::int64_t value);
  std::int64_t allreduce_min(std::int64_t value);

  // Control plane: in-place element-wise sum of host doubles (evaluation totals). Not counted
  // as a data-plane call.
  virtual void allreduce_sum_host(double* values, std::size_t count) = 0;
  // Control plane: every rank's `bytes` host bytes, in rank order, into `receive`
  // (size() * bytes bytes).
  virtual void allgather(const void* send, std::size_t bytes, void* receive) = 0;

  // Control plane: copies `bytes` host bytes from `root` to every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  void broadcast(std::string& text, int root);
  virtual void barrier() = 0;

  // Number of data-plane reductions (all-reduce or reduce-scatter) made so far on this rank
  // (from any thread), and of data-plane all-gathers.
  std::uint64_t data_allreduce_calls() const noexcept { return data_allreduce_calls_.load(); }
  std::uint64_t data_allgather_calls() const noexcept { return data_allgather_calls_.load(); }

 protected:
  // `what`: the caller's name for the collective, or null for the backend's own.
  virtual void do_allreduce_sum(float* data, std::size_t count, const char* what) = 0;
  virtual void do_allreduce_sum(double* data, std::size_t count, const char* what) = 0;
  virtual void do_queue_allreduce_sum(float* data, std::size_t count, const char* what) {
    do_allreduce_sum(data, count, what);
  }
  // The defaults are built on the all-reduce (correct for any backend, with the bytes of a whole
  // all-reduce each): the reduce-scatter sums every chunk; the all-gather sums the buffer with
  // every chunk but this rank's zeroed.
  virtual void do_reduce_scatter_sum(float* data, std::size_t chunk, const char* what);
  // The default reduce is the all-reduce (every rank gets the sum, the root among them).
  virtual void do_reduce_sum(float* data, std::size_t count, int root, const char* what) {
    (void)root;
    do_allreduce_sum(data, count, what);
  }
  virtual void do_queue_reduce_sum(float* data, std::size_t count, int root, const char* what) {
    do_reduce_sum(data, count, root, what);
  }
  virtual void do_allgather_in_place(float* data, std::size_t chunk, const char* what);

 private:
  std::atomic<std::uint64_t> data_allreduce_calls_{0};
  std::atomic<std::uint64_t> data_allgather_calls_{0};
};

}  // namespace autoaccum::comm
