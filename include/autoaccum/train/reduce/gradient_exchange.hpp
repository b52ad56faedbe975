// GradientExchange: how a step's gradients, buffer changes and control table travel between
// the ranks, chosen and allocated once at set-up: one buffer all-reduced after the last backward
// pass, in buckets during it (--overlap), or reduce-scattered in slices, each rank keeping the
// optimizer state of its own (--shard optimizer). It owns the buffer, the buckets and the
// Reducer the step writes into, and says what it is and what each rank holds for it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autoaccum/comm/communicator.hpp"
#include "autoaccum/train/options.hpp"
#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reduce_buffer.hpp"
#include "autoaccum/train/reduce/reducer.hpp"

namespace autoaccum::train {

class GradientExchange {
 public:
  // What travels: the trainable parameters (their gradients), `buffer_floats` of buffer
  // changes and `control_floats` of control table. `frozen_elements` are held but never sent.
  struct Sizes {
    std::int64_t buffer_floats = 0, control_floats = 0, frozen_elements = 0;
  };
  // Allocates the buffer (or the sharded one, the parameters moved into it): an out-of-memory
  // here is the caller's to name. `comm` carries the control plane, `gradient_comm` the
  // gradients (NCCL on a GPU, else the same).
  GradientExchange(const TrainOptions& options, comm::Communicator& comm,
                   comm::Communicator& gradient_comm, c10::Device device,
                   const std::vector<at::Tensor>& trainable, Sizes sizes);
  GradientExchange(const GradientExchange&) = delete;
  GradientExchange& operator=(const GradientExchange&) = delete;

  // --shard optimizer or gradients on more than one rank (kNone on one rank).
  ShardLevel level() const { return level_; }
  bool sharded() const { return level_ != ShardLevel::kNone; }
  // Collective: whether the gradients go in buckets during the last backward pass (--overlap;
  // auto: between nodes, on CPUs), all-reduced or, sharded, reduced to their owners.
  void choose_overlap(bool use_cuda);
  Reducer& reducer() { return *reducer_; }

  // The step's collectives, timed: the seconds since reset_seconds(), this rank's own.
  void reduce();
  void reset_seconds() { seconds_ = 0; }
  double seconds() const { return seconds_; }
  // After the first backward pass: autograd still accumulates into the bound views (an internal
  // error otherwise).
  void check_views();

  // For the banner and the run log: how the gradients travel, the buckets, the nodes the ranks
  // span, and each rank's fixed bytes (FixedBytes::total with the frozen parameters) at `level`
  // (this exchange's or another), for an optimizer keeping `state_floats` per element.
  std::string description() const;
  std::size_t buckets() const;
  std::int64_t bucket_bytes() const;
  std::size_t nodes() const;
  std::vector<std::int64_t> fixed_bytes(ShardLevel level, int state_floats) const;
  // Every level's largest, this one's marked: "... 40.1 MiB with --shard optimizer (this run)".
  std::string fixed_bytes_text(int state_floats) const;

 private:
  const TrainOptions& options_;
  comm::Communicator& comm_;
  comm::Communicator& gradient_comm_;
  int world_;
  ShardLevel level_;
  std::vector<at::Tensor> trainable_;
  std::int64_t trainable_elements_ = 0, largest_ = 0;
  // --shard gradients' bucket size and staging floats (known at every level, for the counts).
  std::int64_t sliced_bucket_bytes_ = 0, staging_floats_ = 0;
  Sizes sizes_;
  std::unique_ptr<ReduceBuffer> buffer_;  // replicated: gradients, buffer changes, control
  ReduceLayout::Handle gradient_region_ = 0, buffer_region_ = 0, control_region_ = 0;
  // Declared after `buffer_`: its thread writes into that buffer.
  std::unique_ptr<BucketedReduce> bucketed_;
  std::unique_ptr<Reducer> reducer_;  // declared after what it refers to
  double seconds_ = 0;
  bool views_checked_ = false;
};

}  // namespace autoaccum::train
