// Reducer: the step's collectives, whatever carries them (an all-reduce of one buffer, buckets
// during the last backward pass, or a sharded buffer reduced to the ranks owning each slice).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/train/reduce/reduce_layout.hpp"

namespace autoaccum::train {

class ReduceBuffer;
class BucketedReduce;
struct Bucket;

// --shard optimizer: rank r of W owns elements [r*S, (r+1)*S) of the flat parameter space
// (S = ceil(P / W), the last rank's slice shorter or empty), keeps optimizer state only for
// them, updates them and all-gathers them. The parameters are moved into one flat buffer in
// reverse order (backward makes the last layers' gradients first, and buckets go in the
// buffer's order), each keeping its identity (the model and the optimizer hold the same
// tensors), only its data now a view. Their gradients are views of a flat buffer of the same
// layout, followed by the tail (buffer changes and control table): the gradients are
// reduce-scattered (or reduced bucket by bucket to the ranks owning them, during the last
// backward pass, with --overlap), then the tail is all-reduced, the step's last collective,
// whose flags every rank decides on. No gradient of any parameter exists outside that buffer.
struct ShardLayout {
  int world = 1;
  std::int64_t elements = 0;  // P: trainable parameter elements
  std::int64_t slice = 0;     // S: floats per slice
  std::int64_t tail = 0;      // K: buffer changes + control table
  // Where each trainable parameter (in the order given) starts in the flat space.
  std::vector<std::int64_t> offsets;
  std::int64_t begin(int rank) const { return std::min(elements, slice * rank); }
  std::int64_t end(int rank) const { return std::min(elements, slice * (rank + 1)); }
};
ShardLayout shard_layout(int world, std::int64_t elements, std::int64_t tail);
// Moves each parameter's data into `flat` (float32, at least their size), last parameter first,
// each keeping its identity; returns where each starts, in the order given. The parameters must
// be float32 (UsageError).
std::vector<std::int64_t> move_into_flat(const std::vector<at::Tensor>& trainable,
                                         at::Tensor& flat);

// What a rank holds whatever its micro-batch (the memory model's fixed part), counted from the
// sizes: the trainable parameters, the gradients (the buffer with the tail; sliced: this rank's
// accumulator, the tail and the staging bucket), the optimizer's state (`state_floats` per
// element it steps: 2 for AdamW, 1 for SGD with momentum, 0 without), and, with the gradients
// sliced, the largest parameter's gradient as backward makes it before its bucket goes (with a
// buffer, the built-in layers' backward accumulates into it in place: measured, nothing more).
// Frozen parameters are the caller's to add. Sharded, parameters are padded to W * S.
struct FixedBytes {
  std::int64_t parameters = 0, gradients = 0, optimizer = 0, transient = 0;
  std::int64_t total() const { return parameters + gradients + optimizer + transient; }
};
// How much of the step's state each rank keeps: everything; its slice of the optimizer state
// (--shard optimizer); and also its slice of the accumulated gradients (--shard gradients).
enum class ShardLevel { kNone, kOptimizer, kGradients };
const char* to_string(ShardLevel level);
// `largest`: the largest trainable parameter's elements; `staging`: the floats of the
// gradients level's staging bucket (gradient_staging_floats).
FixedBytes fixed_bytes(ShardLevel level, const ShardLayout& layout, int rank, int state_floats,
                       std::int64_t largest, std::int64_t staging);

// What an attempt hands to the step's collective, and what it reads back. The attempt writes
// its contribution into part(kBuffers) (the model's buffer changes: BatchNorm statistics) and
// part(kControl) (the control table: out-of-memory flags, peaks, loss sums, stop), while autograd
// accumulates the gradients into the views the reducer bound; after reduce(), every rank reads
// the same sums from the same two parts, and the gradients it updates from gradients(). The
// attempt does not know which reducer it has.
class Reducer {
 public:
  enum class Part { kBuffers, kControl };
  virtual ~Reducer() = default;

  virtual void begin() = 0;  // a new attempt: every gradient and both parts zero
  // The attempt's micro-batches on this rank, once planned (--shard gradients reduces every
  // micro-batch's gradients, and every rank must issue as many collectives as the rank with the
  // most: an all-reduce of the counts on the control plane). A rank that fails before it calls
  // this makes the same collective in reduce(), with 0.
  virtual void expect_micro_batches(std::int64_t count) { (void)count; }
  // A micro-batch's backward pass, from `loss`, is about to run (`last`: the attempt's last;
  // --overlap sends its buckets), and has run.
  virtual void before_backward(const at::Tensor& loss, bool last) {
    (void)loss;
    (void)last;
  }
  virtual void after_backward() {}
  // Before reduce(): this rank's contribution (written in place); after: the sum over ranks.
  virtual at::Tensor part(Part part) = 0;
  // The step's collectives. Every rank calls it once per attempt, whatever happened to it.
  virtual void reduce() = 0;
  // After reduce(): the summed gradients this rank updates (all of them, or its slice).
  virtual at::Tensor gradients() = 0;
  // The tensors the optimizer updates with gradients(): the trainable parameters, or this
  // rank's slice of them as one flat tensor whose .grad() is gradients().
  virtual const std::vector<at::Tensor>& stepped() const = 0;
  // The sum over every rank of a value each rank computed from its gradients() (the squares
  // for the norm), the same bits on every rank: the value itself when not sharded.
  virtual double total(double mine) = 0;
  // After an optimizer step: a sharded reducer all-gathers the updated parameters.
  virtual void after_step() {}
  // Whether autograd still accumulates into the bound gradients (checked after a backward).
  virtual bool gradients_intact() const = 0;
  // One collective of the whole (zero) buffer, before the first step: NCCL allocates its own
  // device buffers at the first collective, and a GPU too full for them fails here.
  virtual void warm_up() = 0;
  // --shard optimizer: which rank owns which elements of the parameters; null when every rank
  // holds everything.
  virtual const ShardLayout* shards() const { return nullptr; }

  // --overlap: the gradients as bound (the buffer; the float where the first bound parameter's
  // gradient starts; the parameters in binding order; the floats each rank owns from there, 0
  // when every rank holds every sum), for a BucketedReduce made over them; after
  // send_in_buckets() the reducer sends the gradients through it, then the tail.
  struct Binding {
    at::Tensor buffer;
    std::int64_t offset = 0;
    std::vector<at::Tensor> parameters;
    std::int64_t owner_slice = 0;
  };
  virtual Binding binding() const = 0;
  virtual void send_in_buckets(BucketedReduce& buckets) = 0;
};

// Every rank holds every gradient: one all-reduce of the whole buffer (or buckets during the
// last backward pass, then the tail, once send_in_buckets() was called).
std::unique_ptr<Reducer> replicated_reducer(comm::Communicator& comm, ReduceBuffer& buffer,
                                            const std::vector<at::Tensor>& trainable,
                                            ReduceLayout::Handle gradient_region,
                                            ReduceLayout::Handle buffer_region,
                                            ReduceLayout::Handle control_region);

// --shard optimizer's reducer (the layout above) over `trainable`, in that order.
std::unique_ptr<Reducer> sharded_reducer(comm::Communicator& gradient_comm,
                                         comm::Communicator& control_comm,
                                         const std::vector<at::Tensor>& trainable,
                                         std::int64_t buffer_floats, std::int64_t control_floats,
                                         c10::Device device);

// --shard gradients (sliced_gradients.cpp): the same layout, but no rank holds a whole gradient
// buffer. During every micro-batch's backward pass each parameter's gradient, once made, waits
// for its bucket (gradient_buckets, of `bucket_bytes`); a bucket goes, in the fixed bucket order,
// copied into the staging buffer (or from its one parameter's gradient), as one reduce to each
// rank owning some of it, which adds its part into its accumulator of S floats; its gradients
// are then freed. Every rank issues every bucket's reduces for every micro-batch up to the
// largest count any rank has in the attempt (expect_micro_batches), zeros where it has no
// micro-batch or failed, then the tail; the tail's flags decide as in the other levels, and
// begin() zeroes the accumulator of an attempt that did not count.
std::unique_ptr<Reducer> gradient_sharded_reducer(comm::Communicator& gradient_comm,
                                                  comm::Communicator& control_comm,
                                                  const std::vector<at::Tensor>& trainable,
                                                  std::int64_t buffer_floats,
                                                  std::int64_t control_floats,
                                                  std::int64_t bucket_bytes, c10::Device device);
// --shard gradients' buckets over parameters of `sizes` (binding order) from float 0: whole
// parameters, each bucket closed once it holds `bucket_bytes`, and a parameter of that size or
// more alone in its own (it goes from its gradient, with no staging copy), so no staged bucket
// reaches twice the size. Every parameter is in exactly one bucket, in order, without gaps.
std::vector<Bucket> gradient_buckets(const std::vector<std::int64_t>& sizes,
                                     std::int64_t bucket_bytes);
// The floats of the staging bucket: the largest bucket of more than one parameter.
std::int64_t gradient_staging_floats(const std::vector<std::int64_t>& sizes,
                                     std::int64_t bucket_bytes);

}  // namespace autoaccum::train
