// GradientExchange: the step's collective chosen and allocated at set-up (--overlap, --shard),
// timed as the step runs it, and described for the banner and the run log
// (reduce/gradient_exchange.hpp; docs/design.md, "Overlapped all-reduce").
#include "autoaccum/train/reduce/gradient_exchange.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::train {

GradientExchange::GradientExchange(const TrainOptions& options, comm::Communicator& comm,
                                   comm::Communicator& gradient_comm, c10::Device device,
                                   const std::vector<at::Tensor>& trainable, Sizes sizes)
    : options_(options),
      comm_(comm),
      gradient_comm_(gradient_comm),
      world_(comm.size()),
      level_(comm.size() == 1               ? ShardLevel::kNone
             : options.shard == "optimizer" ? ShardLevel::kOptimizer
             : options.shard == "gradients" ? ShardLevel::kGradients
                                            : ShardLevel::kNone),
      trainable_(trainable),
      sizes_(sizes) {
  std::vector<std::int64_t> sizes_in_binding_order;
  for (auto p = trainable_.rbegin(); p != trainable_.rend(); ++p) {
    trainable_elements_ += p->numel();
    largest_ = std::max(largest_, p->numel());
    sizes_in_binding_order.push_back(p->numel());
  }
  // --shard gradients: buckets of --bucket-mib, but at most a quarter of a rank's slice, so that
  // the staging bucket (less than two buckets) never holds back much of what the level saves.
  const std::int64_t slice = (trainable_elements_ + world_ - 1) / world_;
  const auto bucket = std::max<std::int64_t>(
      4, std::min(static_cast<std::int64_t>(options.bucket_mib * 1024.0 * 1024.0), slice));
  sliced_bucket_bytes_ = bucket;
  staging_floats_ = gradient_staging_floats(sizes_in_binding_order, bucket);
  // Parameters in reverse order, as the replicated buffer binds them: rank 0 owns the slice
  // that holds the last layers.
  if (level_ == ShardLevel::kOptimizer) {
    reducer_ = sharded_reducer(gradient_comm_, comm_, trainable_, sizes_.buffer_floats,
                               sizes_.control_floats, device);
    return;
  }
  if (level_ == ShardLevel::kGradients) {
    reducer_ = gradient_sharded_reducer(gradient_comm_, comm_, trainable_, sizes_.buffer_floats,
                                        sizes_.control_floats, bucket, device);
    return;
  }
  ReduceLayout layout;
  gradient_region_ = layout.add("gradients", trainable_elements_);
  buffer_region_ = layout.add("buffers", sizes_.buffer_floats);
  control_region_ = layout.add("control", sizes_.control_floats);
  buffer_ = std::make_unique<ReduceBuffer>(std::move(layout), device);
  // In reverse: backward produces the last layers' gradients first, and --overlap's buckets go
  // in the buffer's order (docs/design.md, "Overlapped all-reduce").
  buffer_->bind_gradients(std::vector<at::Tensor>(trainable_.rbegin(), trainable_.rend()),
                          gradient_region_);
  reducer_ = replicated_reducer(gradient_comm_, *buffer_, trainable_, gradient_region_,
                                buffer_region_, control_region_);
}

void GradientExchange::choose_overlap(bool use_cuda) {
  const std::string& asked = options_.overlap;
  // On a GPU, auto stays off until measured there; --overlap on queues the buckets on NCCL's
  // stream (BucketedReduce's queued mode).
  bool overlap = asked == "on" || (asked == "auto" && nodes() > 1 && world_ > 1 && !use_cuda);
  comm::collectively(comm_, [&] {
    if (overlap && use_cuda && !gradient_comm_.queues_collectives()) {
      throw UsageError(
          "--overlap on with --device cuda: needs the NCCL backend (--backend "
          "nccl or auto), whose collectives queue on a stream of their own; "
          "--backend " +
          options_.backend + " gives " + std::string(gradient_comm_.backend()));
    }
    if (overlap && !use_cuda && !gradient_comm_.collectives_from_any_thread()) {
      if (asked == "on") {
        throw UsageError(
            "--overlap on: the MPI library gave less than MPI_THREAD_SERIALIZED, so the "
            "communication thread may not call it; use --overlap off");
      }
      overlap = false;
    }
  });
  // --shard gradients sends its buckets during every backward pass whatever --overlap says.
  if (!overlap || level_ == ShardLevel::kGradients) return;
  comm::collectively(comm_, [&] {
    const auto bytes = static_cast<std::int64_t>(options_.bucket_mib * 1024.0 * 1024.0);
    const Reducer::Binding bound = reducer_->binding();
    bucketed_ = std::make_unique<BucketedReduce>(gradient_comm_, bound.buffer, bound.offset,
                                                 bound.parameters, bytes, bound.owner_slice);
  });
  reducer_->send_in_buckets(*bucketed_);
}

void GradientExchange::reduce() {
  // On a GPU, NCCL's stream waits for the backward pass through an event: the time includes
  // backward kernels still queued.
  const auto start = std::chrono::steady_clock::now();
  reducer_->reduce();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientExchange::check_views() {
  if (views_checked_) return;
  if (!reducer_->gradients_intact()) throw Error("internal: autograd replaced a gradient view");
  views_checked_ = true;
}

std::string GradientExchange::description() const {
  std::ostringstream text;
  if (level_ == ShardLevel::kGradients) {
    text << "sharded (--shard gradients): every micro-batch's gradients reduced to the ranks "
            "owning each slice as its backward pass makes them, "
         << buckets() << " bucket(s) of " << memory::format_bytes(bucket_bytes())
         << " in reverse parameter order, then the step's control values; an all-gather of the "
            "parameters per step";
    return text.str();
  }
  if (level_ == ShardLevel::kOptimizer) {
    text << "sharded (--shard optimizer): ";
    if (bucketed_) {
      text << "reduced to the ranks owning each slice, overlapped with the last backward pass: "
           << bucketed_->buckets().size() << " bucket(s) of "
           << memory::format_bytes(bucketed_->bucket_bytes()) << " in reverse parameter order"
           << (bucketed_->queued() ? ", queued on NCCL's stream" : "");
    } else {
      text << "one reduce-scatter of the gradients per attempt";
    }
    text << ", then the step's control values; an all-gather of the parameters per step";
    return text.str();
  }
  if (!bucketed_) {
    return world_ > 1 ? "after the last backward pass, one collective per attempt"
                      : "after the last backward pass";
  }
  text << "overlapped with the last backward pass: " << bucketed_->buckets().size()
       << " bucket(s) of " << memory::format_bytes(bucketed_->bucket_bytes())
       << " in reverse parameter order" << (bucketed_->queued() ? ", queued on NCCL's stream" : "")
       << ", then the step's control values";
  return text.str();
}

// Distinct hosts among the ranks.
std::size_t GradientExchange::nodes() const {
  std::vector<std::string> hosts(comm_.hosts());
  std::sort(hosts.begin(), hosts.end());
  return static_cast<std::size_t>(std::unique(hosts.begin(), hosts.end()) - hosts.begin());
}

std::size_t GradientExchange::buckets() const {
  if (level_ == ShardLevel::kGradients) {
    std::vector<std::int64_t> sizes;
    for (auto p = trainable_.rbegin(); p != trainable_.rend(); ++p)
      sizes.push_back(p->numel());
    return gradient_buckets(sizes, bucket_bytes()).size();
  }
  return bucketed_ ? bucketed_->buckets().size() : 0;
}

std::int64_t GradientExchange::bucket_bytes() const {
  if (level_ == ShardLevel::kGradients) return sliced_bucket_bytes_;
  return bucketed_ ? bucketed_->bucket_bytes() : 0;
}

std::vector<std::int64_t> GradientExchange::fixed_bytes(ShardLevel level, int state_floats) const {
  const std::int64_t tail = sizes_.buffer_floats + sizes_.control_floats;
  const std::int64_t frozen = static_cast<std::int64_t>(sizeof(float)) * sizes_.frozen_elements;
  const ShardLayout layout = shard_layout(world_, trainable_elements_, tail);
  std::vector<std::int64_t> out;
  for (int r = 0; r < world_; ++r) {
    out.push_back(
        frozen +
        train::fixed_bytes(level, layout, r, state_floats, largest_, staging_floats_).total());
  }
  return out;
}

std::string GradientExchange::fixed_bytes_text(int state_floats) const {
  std::string text =
      "fixed bytes per rank (parameters, gradients, optimizer state; gradients "
      "sharded: with a staging bucket and the largest gradient as made):";
  for (const ShardLevel level :
       {ShardLevel::kNone, ShardLevel::kOptimizer, ShardLevel::kGradients}) {
    const std::vector<std::int64_t> bytes = fixed_bytes(level, state_floats);
    text += std::string(level == ShardLevel::kNone ? " " : ", ") +
            memory::format_bytes(*std::max_element(bytes.begin(), bytes.end())) +
            (level == ShardLevel::kNone ? " unsharded"
                                        : std::string(" with --shard ") + to_string(level)) +
            (level == level_ ? " (this run)" : "");
  }
  return text;
}

}  // namespace autoaccum::train
