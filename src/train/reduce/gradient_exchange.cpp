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
      sharded_(options.shard == "optimizer" && comm.size() > 1),
      trainable_(trainable),
      sizes_(sizes) {
  for (const at::Tensor& p : trainable_)
    trainable_elements_ += p.numel();
  if (sharded_) {
    // Parameters in reverse order, as the replicated buffer binds them: rank 0 owns the slice
    // that holds the last layers.
    reducer_ = sharded_reducer(gradient_comm_, comm_, trainable_, sizes_.buffer_floats,
                               sizes_.control_floats, device);
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
  if (!overlap) return;
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
  if (sharded_) {
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

std::vector<std::int64_t> GradientExchange::fixed_bytes(bool sharded_state,
                                                        int state_floats) const {
  const std::int64_t tail = sizes_.buffer_floats + sizes_.control_floats;
  const std::int64_t frozen = static_cast<std::int64_t>(sizeof(float)) * sizes_.frozen_elements;
  const ShardLayout layout = shard_layout(world_, trainable_elements_, tail);
  std::vector<std::int64_t> out;
  for (int r = 0; r < world_; ++r) {
    out.push_back(frozen +
                  (sharded_state && world_ > 1
                       ? sharded_fixed_bytes(layout, r, state_floats).total()
                       : replicated_fixed_bytes(trainable_elements_, tail, state_floats).total()));
  }
  return out;
}

std::string GradientExchange::fixed_bytes_text(int state_floats) const {
  const auto largest = [](const std::vector<std::int64_t>& v) {
    return memory::format_bytes(*std::max_element(v.begin(), v.end()));
  };
  const std::string whole = largest(fixed_bytes(false, state_floats));
  const std::string sliced = largest(fixed_bytes(true, state_floats));
  return "fixed bytes per rank (parameters, gradients, optimizer state): " +
         (sharded_ ? sliced + " sharded (--shard optimizer), " + whole + " without"
                   : whole + ", " + sliced + " with --shard optimizer");
}

}  // namespace autoaccum::train
