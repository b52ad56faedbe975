// BucketedReduce: the gradient region all-reduced (or, sharded, reduced to the ranks owning it)
// in buckets while the last micro-batch's backward pass still runs (--overlap), under the same
// agreement as the one collective.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"

namespace torch::autograd {
struct Node;
}

namespace autoaccum::train {

// A bucket: a contiguous range of the gradient region holding whole parameters' gradients.
struct Bucket {
  std::int64_t offset = 0;  // in floats, from the start of the reduce buffer
  std::int64_t count = 0;
  std::size_t first = 0, last = 0;  // the parameters [first, last) in binding order
};

// How a timeout names the all-reduce of the step's control values on `comm` (after the buckets,
// or after a sharded step's reduce-scatter).
std::string control_values_label(const comm::Communicator& comm);

// Which of `nodes` (parameters' gradient accumulators) the backward pass from `loss` will run: a
// walk of its graph (what DDP does for find_unused_parameters), a few microseconds per thousand
// nodes. A parameter whose accumulator is not reached gets no gradient in that pass.
std::vector<char> reached(const at::Tensor& loss,
                          const std::vector<std::shared_ptr<torch::autograd::Node>>& nodes);

// Cuts parameters of `sizes` floats, bound one after the other from `offset`, into buckets of at
// least `bucket_floats` floats each (the last one may be smaller; a parameter larger than a bucket
// makes a bucket of its own once it is reached). Every parameter is in exactly one bucket; the
// buckets follow binding order and cover the region without gaps.
std::vector<Bucket> cut_buckets(std::int64_t offset, const std::vector<std::int64_t>& sizes,
                                std::int64_t bucket_floats);

// The protocol that keeps ranks safe (docs/design.md, "Overlapped all-reduce"): on every attempt
// every rank issues the same collectives in the same order, bucket 1 to n of the gradient
// region, then the step's tail (BatchNorm changes and the control values, which carry the
// out-of-memory flags), whatever happened to it. A bucket is all-reduced on a communication
// thread as soon as the last of its parameters' gradients has been accumulated during the
// attempt's last backward pass (an autograd hook on each parameter's gradient accumulator), in
// bucket order; earlier micro-batches accumulate locally, as without overlap. A rank that ran out
// of memory, was stopped, or whose model left some parameters without a gradient sends what its
// buckets hold when the attempt ends (the tail's flags then make every rank drop the attempt, so
// what a failed rank sent is never used). The sums are the same as the one collective's: with
// two ranks they are bitwise equal.
// With a communicator that queues its collectives (NCCL: Communicator::queues_collectives) there
// is no thread: the autograd thread that completes a bucket queues its sum on NCCL's stream, after
// the accumulation kernels already queued on the model's stream, and returns at once; the tail's
// all-reduce, issued after every bucket on the same stream, is the one the host waits for.
class BucketedReduce {
 public:
  // `parameters`: bound into `buffer` (1-D float; on the host unless `comm` queues its
  // collectives) one after the other from float `offset`, as ReduceBuffer::bind_gradients does.
  // `owner_slice` > 0 (--shard optimizer): rank j needs only the sums of the floats
  // [offset + j * owner_slice, offset + (j + 1) * owner_slice), and a bucket goes as one reduce
  // to each rank owning some of it instead of an all-reduce. Starts the communication thread
  // when `comm` does not queue.
  BucketedReduce(comm::Communicator& comm, at::Tensor buffer, std::int64_t offset,
                 const std::vector<at::Tensor>& parameters, std::int64_t bucket_bytes,
                 std::int64_t owner_slice = 0);
  ~BucketedReduce();
  BucketedReduce(const BucketedReduce&) = delete;
  BucketedReduce& operator=(const BucketedReduce&) = delete;

  const std::vector<Bucket>& buckets() const noexcept;
  std::int64_t bucket_bytes() const noexcept;
  // How a timeout names the step's tail, the collective after the buckets.
  const char* tail_label() const noexcept;
  // Whether the sums are queued (the communicator queues collectives) rather than made by the
  // communication thread.
  bool queued() const noexcept;

  // A new attempt: every bucket waits for its parameters (the buffer was zeroed).
  void begin();
  // The attempt's last backward pass, from `loss`, is about to run: from now on a bucket goes as
  // soon as its last gradient is accumulated. Parameters `loss` does not depend on (its autograd
  // graph does not reach their accumulators: an unused layer, a branch not taken) are ready at
  // once, so that they do not hold back the buckets after theirs.
  void arm(const at::Tensor& loss);
  // The attempt is over (done, out of memory, stopped): every bucket not sent yet is sent now,
  // in order; returns once all are reduced. Rethrows a communication error of the thread.
  void finish();

  struct Shared;  // the state the thread and the autograd hooks share (bucketed_reduce.cpp)

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace autoaccum::train
