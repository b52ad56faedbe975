// Trainer::State's reduce path at setup: whether the gradients go in buckets during the last
// backward pass (--overlap), and the backward-pass out-of-memory drill (--inject-oom backward=1).
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <algorithm>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {

void Trainer::State::choose_overlap(const std::vector<at::Tensor>& bound) {
  const bool several_nodes = node_count() > 1;
  const std::string& asked = options.overlap;
  // On a GPU, auto stays off until measured there; --overlap on queues the buckets on NCCL's
  // stream (BucketedReduce's queued mode).
  bool overlap =
      asked == "on" || (asked == "auto" && several_nodes && world > 1 && !context.use_cuda);
  comm::collectively(comm, [&] {
    if (overlap && context.use_cuda && !reduce_comm().queues_collectives()) {
      throw UsageError(
          "--overlap on with --device cuda: needs the NCCL backend (--backend "
          "nccl or auto), whose collectives queue on a stream of their own; "
          "--backend " +
          options.backend + " gives " + std::string(reduce_comm().backend()));
    }
    if (overlap && !context.use_cuda && !reduce_comm().collectives_from_any_thread()) {
      if (asked == "on") {
        throw UsageError(
            "--overlap on: the MPI library gave less than MPI_THREAD_SERIALIZED, so the "
            "communication thread may not call it; use --overlap off");
      }
      overlap = false;
    }
  });
  if (!overlap) return;
  comm::collectively(comm, [&] {
    const auto bytes = static_cast<std::int64_t>(options.bucket_mib * 1024.0 * 1024.0);
    bucketed = std::make_unique<BucketedReduce>(
        reduce_comm(), reduce->all(), reduce->layout()[gradient_region].offset, bound, bytes);
  });
}

namespace {

// --inject-oom backward=1: runs before a gradient accumulator (called even when a fused layer
// already added its gradient and passes none on, which a tensor hook would not see).
class InjectedOutOfMemory final : public torch::autograd::FunctionPreHook {
 public:
  explicit InjectedOutOfMemory(std::atomic<bool>& armed) : armed_(armed) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (armed_.exchange(false)) {
      memory::throw_out_of_memory(
          "injected out-of-memory (--inject-oom backward=1) in the backward pass");
    }
    return grads;
  }

 private:
  std::atomic<bool>& armed_;
};

}  // namespace

void Trainer::State::install_backward_injection() {
  const bool mine = std::any_of(options.inject_oom.begin(), options.inject_oom.end(),
                                [&](const auto& i) { return i.backward && i.rank == rank; });
  if (!mine || parameters.trainable.empty()) return;
  // The first parameter's gradient comes last in backward: the others exist by then (and with
  // --overlap their buckets have gone), as in a real out-of-memory late in the backward pass.
  injection_accumulator = torch::autograd::impl::grad_accumulator(parameters.trainable.front());
  injection_accumulator->add_pre_hook(std::make_unique<InjectedOutOfMemory>(inject_in_backward));
}

std::string Trainer::State::overlap_text() const {
  if (sharded()) {
    return "sharded (--shard optimizer): one reduce-scatter per attempt, every slice carrying "
           "the step's control values; an all-gather of the parameters per step";
  }
  if (!bucketed) {
    return world > 1 ? "after the last backward pass, one collective per attempt"
                     : "after the last backward pass";
  }
  std::ostringstream text;
  text << "overlapped with the last backward pass: " << bucketed->buckets().size()
       << " bucket(s) of " << memory::format_bytes(bucketed->bucket_bytes())
       << " in reverse parameter order" << (bucketed->queued() ? ", queued on NCCL's stream" : "")
       << ", then the step's control values";
  return text.str();
}

// Each rank's fixed bytes (parameters, gradients' buffer, optimizer state, frozen parameters) as
// this reduction holds them, sharded or not.
std::size_t Trainer::State::node_count() const {
  std::vector<std::string> hosts(comm.hosts());
  std::sort(hosts.begin(), hosts.end());
  return static_cast<std::size_t>(std::unique(hosts.begin(), hosts.end()) - hosts.begin());
}

std::vector<std::int64_t> Trainer::State::fixed_bytes(bool sharded_state) const {
  const std::int64_t tail = model_state->reduce_count() + control.count();
  const auto state = static_cast<int>(optimizer->state_kinds().size());
  const std::int64_t frozen = static_cast<std::int64_t>(sizeof(float)) * parameters.frozen_elements;
  const ShardLayout layout = shard_layout(world, parameters.trainable_elements, tail);
  std::vector<std::int64_t> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(
        frozen +
        (sharded_state && world > 1
             ? sharded_fixed_bytes(layout, r, state).total()
             : replicated_fixed_bytes(parameters.trainable_elements, tail, state).total()));
  }
  return out;
}

std::string Trainer::State::fixed_bytes_text() const {
  const auto largest = [](const std::vector<std::int64_t>& v) {
    return memory::format_bytes(*std::max_element(v.begin(), v.end()));
  };
  const std::string whole = largest(fixed_bytes(false));
  const std::string sliced = largest(fixed_bytes(true));
  return "fixed bytes per rank (parameters, gradients, optimizer state): " +
         (sharded() ? sliced + " sharded (--shard optimizer), " + whole + " without"
                    : whole + ", " + sliced + " with --shard optimizer");
}

// The banner's data line: the data, the global batch, the steps and how micro-batches are sized.
}  // namespace autoaccum::train
