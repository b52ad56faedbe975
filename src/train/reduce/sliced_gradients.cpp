// --shard gradients: each rank keeps only its slice of the accumulated gradient. Every
// micro-batch's gradients go to the ranks owning them, in buckets, as backward makes them
// (reducer.hpp, gradient_sharded_reducer; docs/design.md, "Sharding").
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reducer.hpp"

namespace autoaccum::train {
namespace {

// What the hooks and the reducer share: the hooks hang on autograd's accumulators, which may
// outlive the reducer, so they hold it weakly.
struct Slices {
  comm::Communicator& comm;     // the gradients
  comm::Communicator& control;  // the micro-batch counts
  int rank;
  ShardLayout layout;
  std::vector<at::Tensor> bound;  // the parameters in binding order (last one first)
  std::vector<Bucket> buckets;    // over the flat space, from 0
  std::vector<std::string> labels;
  std::vector<std::size_t> bucket_of;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // held: see BucketedReduce
  at::Tensor staging, accumulator, tail;
  // Within the attempt: the micro-batches every rank sends (-1 until agreed), those sent; within
  // the micro-batch: which gradients arrived, each bucket's missing ones, the next to send.
  std::int64_t rounds = -1, sent_rounds = 0;
  std::vector<char> arrived;
  std::vector<std::size_t> pending;
  std::size_t next = 0;
  bool active = false, in_backward = false, started = false;
  bool from_hooks = true;   // the collectives may run on autograd's thread
  std::int64_t twice = -1;  // a parameter whose gradient arrived after its bucket went
  std::mutex mutex;         // autograd may run hooks on a thread of its own

  Slices(comm::Communicator& c, comm::Communicator& k) : comm(c), control(k), rank(c.rank()) {}

  void restart_round() {
    std::fill(arrived.begin(), arrived.end(), 0);
    for (std::size_t b = 0; b < buckets.size(); ++b)
      pending[b] = buckets[b].last - buckets[b].first;
    next = 0;
  }

  void clear_gradients() {
    for (auto& p : bound)
      p.mutable_grad().reset();
  }

  // Parameter `i`'s gradient is made (or will never be, in this backward pass).
  void arrive(std::size_t i) {
    if (arrived[i]) {
      if (bucket_of[i] < next) twice = static_cast<std::int64_t>(i);
      return;
    }
    arrived[i] = 1;
    --pending[bucket_of[i]];
  }

  void send_ready() {
    while (next < buckets.size() && pending[next] == 0)
      send(next++);
  }

  // Bucket `b`: its gradients (zeros where none was made) reduced to each rank owning some of
  // it, in rank order; this rank adds its part into its accumulator; the gradients are freed.
  void send(std::size_t b) {
    const Bucket& bucket = buckets[b];
    at::Tensor from;
    if (bucket.last - bucket.first == 1) {
      // A bucket of one parameter goes from its gradient (zeros in the room the counted
      // transient gradient leaves when none was made).
      const at::Tensor& alone = bound[bucket.first].grad();
      from = alone.defined() ? alone.contiguous().view({-1})
                             : at::zeros({bucket.count}, staging.options());
    } else {
      from = staging.narrow(0, 0, bucket.count);
      const at::NoGradGuard no_grad;
      for (std::size_t i = bucket.first; i < bucket.last; ++i) {
        const at::Tensor& g = bound[i].grad();
        at::Tensor to = from.narrow(0, layout.offsets[i] - bucket.offset, bound[i].numel());
        g.defined() ? (void)to.copy_(g.reshape({-1})) : (void)to.zero_();
      }
    }
    float* const data = from.data_ptr<float>();
    const std::int64_t end = bucket.offset + bucket.count;
    for (std::int64_t at = bucket.offset; at < end;) {
      const auto owner = static_cast<int>(at / layout.slice);
      const std::int64_t upto = std::min(end, (owner + 1) * layout.slice);
      comm.reduce_sum(data + (at - bucket.offset), static_cast<std::size_t>(upto - at), owner,
                      labels[b].c_str());
      at = upto;
    }
    const std::int64_t lo = std::max(bucket.offset, layout.begin(rank));
    const std::int64_t hi = std::min(end, layout.end(rank));
    if (lo < hi)
      accumulator.narrow(0, lo - layout.begin(rank), hi - lo)
          .add_(from.narrow(0, lo - bucket.offset, hi - lo));
    for (std::size_t i = bucket.first; i < bucket.last; ++i)
      bound[i].mutable_grad().reset();
  }

  // The micro-batch's buckets not sent yet go now, in order (zeros for gradients not made).
  void finish_round() {
    if (rounds >= 0 && sent_rounds >= rounds)
      throw std::logic_error("--shard gradients: more micro-batches than the ranks agreed on");
    for (std::size_t i = 0; i < bound.size(); ++i)
      if (!arrived[i]) arrive(i);
    send_ready();
    ++sent_rounds;
    started = false;
    restart_round();
  }
};

// Runs after a parameter's gradient accumulator has made this backward pass's gradient.
class MadeHook final : public torch::autograd::FunctionPostHook {
 public:
  MadeHook(std::weak_ptr<Slices> slices, std::size_t parameter)
      : slices_(std::move(slices)), parameter_(parameter) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    const auto s = slices_.lock();
    if (!s) return outputs;
    const std::lock_guard<std::mutex> lock(s->mutex);
    if (!s->active || !s->in_backward) return outputs;
    s->arrive(parameter_);
    if (s->from_hooks) s->send_ready();
    return outputs;
  }

 private:
  std::weak_ptr<Slices> slices_;
  std::size_t parameter_;
};

class SlicedGradientReduce final : public Reducer {
 public:
  SlicedGradientReduce(comm::Communicator& gradient_comm, comm::Communicator& control_comm,
                       const std::vector<at::Tensor>& trainable, std::int64_t buffer_floats,
                       std::int64_t control_floats, std::int64_t bucket_bytes, c10::Device device)
      : s_(std::make_shared<Slices>(gradient_comm, control_comm)),
        buffer_floats_(buffer_floats),
        control_floats_(control_floats),
        tail_label_(control_values_label(gradient_comm)) {
    Slices& s = *s_;
    s.from_hooks = gradient_comm.collectives_from_any_thread();
    s.bound.assign(trainable.rbegin(), trainable.rend());
    std::int64_t elements = 0;
    std::vector<std::int64_t> sizes;
    for (const auto& p : s.bound) {
      elements += p.numel();
      sizes.push_back(p.numel());
    }
    s.layout = shard_layout(gradient_comm.size(), elements, buffer_floats + control_floats);
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    flat_ = at::zeros({s.layout.world * s.layout.slice}, options);
    const std::vector<std::int64_t> offsets = move_into_flat(trainable, flat_);
    s.layout.offsets.assign(offsets.rbegin(), offsets.rend());  // binding order, inside Slices
    layout_ = s.layout;
    layout_.offsets = offsets;  // the trainable order, for the checkpoint
    s.buckets = gradient_buckets(sizes, bucket_bytes);
    for (std::size_t b = 0; b < s.buckets.size(); ++b) {
      for (std::size_t i = s.buckets[b].first; i < s.buckets[b].last; ++i)
        s.bucket_of.push_back(b);
      s.labels.push_back(
          std::string(gradient_comm.backend() == "nccl" ? "ncclReduce" : "MPI_Reduce") +
          "(float, sum) of gradient bucket " + std::to_string(b + 1) + " of " +
          std::to_string(s.buckets.size()));
    }
    s.staging = at::zeros({gradient_staging_floats(sizes, bucket_bytes)}, options);
    const std::int64_t mine = s.layout.end(s.rank) - s.layout.begin(s.rank);
    s.accumulator = at::zeros({mine}, options);
    s.tail = at::zeros({s.layout.tail}, options);
    s.arrived.assign(s.bound.size(), 0);
    s.pending.assign(s.buckets.size(), 0);
    s.restart_round();
    for (std::size_t i = 0; i < s.bound.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(s.bound[i]);
      if (!accumulator) throw std::logic_error("--shard gradients: a parameter has no accumulator");
      accumulator->add_post_hook(std::make_unique<MadeHook>(s_, i));
      s.accumulators.push_back(std::move(accumulator));
    }
    at::Tensor slice = flat_.narrow(0, s.layout.begin(s.rank), mine).detach();
    slice.set_requires_grad(true);
    slice.mutable_grad() = s.accumulator;
    stepped_.push_back(slice);
  }

  void begin() override {
    Slices& s = *s_;
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.accumulator.zero_();
    s.tail.zero_();
    s.clear_gradients();
    s.rounds = -1;
    s.sent_rounds = 0;
    s.started = false;
    s.twice = -1;
    s.restart_round();
    s.active = true;
  }
  void expect_micro_batches(std::int64_t count) override {
    Slices& s = *s_;
    if (s.rounds >= 0) return;
    s.control.allreduce_max(&count, 1);
    s.rounds = count;
  }
  void before_backward(const at::Tensor& loss, bool) override {
    Slices& s = *s_;
    if (s.rounds < 0) throw std::logic_error("--shard gradients: backward before the count");
    // The parameters `loss` does not reach arrive at once (zeros), so that they do not hold
    // back the buckets after theirs (as BucketedReduce::arm).
    const std::vector<char> used = reached(loss, s.accumulators);
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.started = true;
    s.in_backward = true;
    for (std::size_t i = 0; i < s.accumulators.size(); ++i)
      if (!used[i]) s.arrive(i);
  }
  void after_backward() override {
    Slices& s = *s_;
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.in_backward = false;
    s.finish_round();
  }
  at::Tensor part(Part part) override {
    return part == Part::kBuffers ? s_->tail.narrow(0, 0, buffer_floats_)
                                  : s_->tail.narrow(0, buffer_floats_, control_floats_);
  }
  void reduce() override {
    // Every rank issues the same collectives whatever happened to it: the count (if it failed
    // before it), every bucket of every micro-batch any rank runs, then the tail.
    expect_micro_batches(0);
    Slices& s = *s_;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      s.in_backward = false;
      if (s.started) s.finish_round();
      while (s.sent_rounds < s.rounds)
        s.finish_round();
      s.active = false;
      s.clear_gradients();
    }
    s.comm.allreduce_sum(s.tail.data_ptr<float>(), static_cast<std::size_t>(s.tail.numel()),
                         tail_label_.c_str());
    if (s.twice >= 0) {
      throw Error("--shard gradients: the gradient of parameter " + std::to_string(s.twice) +
                  " (in binding order) was made twice in one backward pass (reentrant backward "
                  "or activation checkpointing), after its bucket was sent; use --shard "
                  "optimizer with this model");
    }
  }
  at::Tensor gradients() override { return s_->accumulator; }
  const std::vector<at::Tensor>& stepped() const override { return stepped_; }
  double total(double mine) override {
    std::vector<double> all(static_cast<std::size_t>(layout_.world));
    s_->control.allgather(&mine, sizeof mine, all.data());
    double sum = 0;
    for (double v : all)  // in rank order on every rank: the same bits everywhere
      sum += v;
    return sum;
  }
  void after_step() override {
    s_->comm.allgather_in_place(flat_.data_ptr<float>(), static_cast<std::size_t>(layout_.slice),
                                "parameter all-gather");
  }
  // No gradient outlives its micro-batch: each was freed once its bucket went.
  bool gradients_intact() const override {
    return std::none_of(s_->bound.begin(), s_->bound.end(),
                        [](const at::Tensor& p) { return p.grad().defined(); });
  }
  const ShardLayout* shards() const override { return &layout_; }
  void warm_up() override {
    Slices& s = *s_;
    s.staging.zero_();
    s.tail.zero_();
    if (s.staging.numel() > 0)
      s.comm.reduce_sum(s.staging.data_ptr<float>(), static_cast<std::size_t>(s.staging.numel()),
                        0);
    s.comm.allreduce_sum(s.tail.data_ptr<float>(), static_cast<std::size_t>(s.tail.numel()));
    s.comm.allgather_in_place(flat_.data_ptr<float>(), static_cast<std::size_t>(layout_.slice));
  }
  Binding binding() const override { return {}; }
  void send_in_buckets(BucketedReduce&) override {
    throw std::logic_error("--shard gradients sends its own buckets");
  }

 private:
  std::shared_ptr<Slices> s_;
  std::int64_t buffer_floats_, control_floats_;
  std::string tail_label_;
  ShardLayout layout_;
  at::Tensor flat_;
  std::vector<at::Tensor> stepped_;
};

}  // namespace

std::vector<Bucket> gradient_buckets(const std::vector<std::int64_t>& sizes,
                                     std::int64_t bucket_bytes) {
  const std::int64_t floats = std::max<std::int64_t>(bucket_bytes / 4, 1);
  std::vector<Bucket> buckets;
  Bucket current;
  const auto close = [&](std::size_t upto) {
    current.last = upto;
    if (current.last > current.first) buckets.push_back(current);
    current = Bucket{current.offset + current.count, 0, upto, upto};
  };
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] >= floats) close(i);  // a parameter of a bucket's size or more goes alone
    current.count += sizes[i];
    if (current.count >= floats) close(i + 1);
  }
  if (!buckets.empty() && current.count == 0)
    buckets.back().last = sizes.size();  // parameters of no elements join the bucket before
  else
    close(sizes.size());
  return buckets;
}

std::int64_t gradient_staging_floats(const std::vector<std::int64_t>& sizes,
                                     std::int64_t bucket_bytes) {
  std::int64_t floats = 0;
  for (const Bucket& b : gradient_buckets(sizes, bucket_bytes))
    if (b.last - b.first > 1) floats = std::max(floats, b.count);
  return floats;
}

std::unique_ptr<Reducer> gradient_sharded_reducer(comm::Communicator& gradient_comm,
                                                  comm::Communicator& control_comm,
                                                  const std::vector<at::Tensor>& trainable,
                                                  std::int64_t buffer_floats,
                                                  std::int64_t control_floats,
                                                  std::int64_t bucket_bytes, c10::Device device) {
  return std::make_unique<SlicedGradientReduce>(
      gradient_comm, control_comm, trainable, buffer_floats, control_floats, bucket_bytes, device);
}

}  // namespace autoaccum::train
