// Reducer: the replicated all-reduce (whole, or in buckets) and the sharded reduction.
#include "autoaccum/train/reduce/reducer.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reduce_buffer.hpp"

namespace autoaccum::train {
namespace {

class ReplicatedReduce final : public Reducer {
 public:
  ReplicatedReduce(comm::Communicator& comm, ReduceBuffer& buffer,
                   std::vector<at::Tensor> trainable, ReduceLayout::Handle gradients,
                   ReduceLayout::Handle buffers, ReduceLayout::Handle control)
      : comm_(comm),
        buffer_(buffer),
        trainable_(std::move(trainable)),
        gradients_(gradients),
        buffers_(buffers),
        control_(control) {}

  void begin() override {
    buffer_.zero();
    if (bucketed_) bucketed_->begin();
  }
  void before_backward(const at::Tensor& loss, bool last) override {
    if (last && bucketed_) bucketed_->arm(loss);
  }
  at::Tensor part(Part part) override {
    return buffer_.view(part == Part::kBuffers ? buffers_ : control_);
  }
  void reduce() override {
    float* const all = buffer_.all().data_ptr<float>();
    const auto floats = static_cast<std::size_t>(buffer_.all().numel());
    if (bucketed_) {
      // The buckets not sent during backward go now, in order, on every rank (also one that ran
      // out of memory: the collectives are the same whatever happened); then the tail, after the
      // gradient region, which carries the flags every rank decides on.
      bucketed_->finish();
      const auto tail = static_cast<std::size_t>(buffer_.layout()[buffers_].offset);
      comm_.allreduce_sum(all + tail, floats - tail, bucketed_->tail_label());
    } else {
      comm_.allreduce_sum(all, floats);
    }
  }
  at::Tensor gradients() override { return buffer_.view(gradients_); }
  const std::vector<at::Tensor>& stepped() const override { return trainable_; }
  double total(double mine) override { return mine; }
  bool gradients_intact() const override { return buffer_.gradients_intact(); }
  void warm_up() override {
    buffer_.all().zero_();
    comm_.allreduce_sum(buffer_.all().data_ptr<float>(),
                        static_cast<std::size_t>(buffer_.all().numel()));
  }
  Binding binding() const override {
    // In reverse, as ReduceBuffer::bind_gradients was given them.
    return {buffer_.all(), buffer_.layout()[gradients_].offset,
            std::vector<at::Tensor>(trainable_.rbegin(), trainable_.rend()), 0};
  }
  void send_in_buckets(BucketedReduce& buckets) override { bucketed_ = &buckets; }

 private:
  comm::Communicator& comm_;
  ReduceBuffer& buffer_;
  BucketedReduce* bucketed_ = nullptr;
  std::vector<at::Tensor> trainable_;
  ReduceLayout::Handle gradients_, buffers_, control_;
};

class ShardedReduce final : public Reducer {
 public:
  ShardedReduce(comm::Communicator& gradient_comm, comm::Communicator& control_comm,
                const std::vector<at::Tensor>& trainable, std::int64_t buffer_floats,
                std::int64_t control_floats, c10::Device device)
      : comm_(gradient_comm),
        control_comm_(control_comm),
        rank_(gradient_comm.rank()),
        buffer_floats_(buffer_floats),
        control_floats_(control_floats),
        tail_label_(control_values_label(gradient_comm)),
        bound_(trainable.rbegin(), trainable.rend()) {
    std::int64_t elements = 0;
    for (const auto& p : trainable)
      elements += p.numel();
    layout_ = shard_layout(gradient_comm.size(), elements, buffer_floats + control_floats);
    const std::int64_t padded = layout_.world * layout_.slice;
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    flat_ = at::zeros({padded}, options);
    reduce_ = at::zeros({padded + layout_.tail}, options);
    layout_.offsets = move_into_flat(trainable, flat_);
    // Each gradient a view of the same place of `reduce_`.
    for (std::size_t k = 0; k < trainable.size(); ++k) {
      at::Tensor p = trainable[k];
      p.mutable_grad() = reduce_.narrow(0, layout_.offsets[k], p.numel()).view(p.sizes());
    }
    const std::int64_t mine = layout_.end(rank_) - layout_.begin(rank_);
    gradients_ = reduce_.narrow(0, layout_.begin(rank_), mine);
    at::Tensor slice = flat_.narrow(0, layout_.begin(rank_), mine).detach();
    slice.set_requires_grad(true);
    slice.mutable_grad() = gradients_;
    stepped_.push_back(slice);
  }

  void begin() override {
    reduce_.zero_();
    if (bucketed_) bucketed_->begin();
  }
  void before_backward(const at::Tensor& loss, bool last) override {
    if (last && bucketed_) bucketed_->arm(loss);
  }
  at::Tensor part(Part part) override {
    const std::int64_t tail = layout_.world * layout_.slice;
    return part == Part::kBuffers ? reduce_.narrow(0, tail, buffer_floats_)
                                  : reduce_.narrow(0, tail + buffer_floats_, control_floats_);
  }
  void reduce() override {
    // Every rank issues the same collectives whatever happened to it: the gradients to their
    // owners, then the tail, whose summed flags decide whether the attempt counts.
    float* const data = reduce_.data_ptr<float>();
    const std::int64_t tail = layout_.world * layout_.slice;
    if (bucketed_) {
      bucketed_->finish();
    } else {
      comm_.reduce_scatter_sum(data, static_cast<std::size_t>(layout_.slice));
    }
    comm_.allreduce_sum(data + tail, static_cast<std::size_t>(layout_.tail),
                        bucketed_ ? bucketed_->tail_label() : tail_label_.c_str());
  }
  at::Tensor gradients() override { return gradients_; }
  const std::vector<at::Tensor>& stepped() const override { return stepped_; }
  double total(double mine) override {
    // Summed in rank order by every rank alike: the same bits everywhere.
    std::vector<double> all(static_cast<std::size_t>(layout_.world));
    control_comm_.allgather(&mine, sizeof mine, all.data());
    double sum = 0;
    for (double v : all)
      sum += v;
    return sum;
  }
  void after_step() override {
    comm_.allgather_in_place(flat_.data_ptr<float>(), static_cast<std::size_t>(layout_.slice),
                             "parameter all-gather");
  }
  bool gradients_intact() const override { return gradients_inside(bound_, reduce_); }
  const ShardLayout* shards() const override { return &layout_; }
  void warm_up() override {
    reduce_.zero_();
    comm_.reduce_scatter_sum(reduce_.data_ptr<float>(), static_cast<std::size_t>(layout_.slice));
    comm_.allreduce_sum(reduce_.data_ptr<float>() + layout_.world * layout_.slice,
                        static_cast<std::size_t>(layout_.tail));
    comm_.allgather_in_place(flat_.data_ptr<float>(), static_cast<std::size_t>(layout_.slice));
  }
  Binding binding() const override { return {reduce_, 0, bound_, layout_.slice}; }
  void send_in_buckets(BucketedReduce& buckets) override { bucketed_ = &buckets; }

 private:
  comm::Communicator& comm_;
  comm::Communicator& control_comm_;
  int rank_;
  std::int64_t buffer_floats_, control_floats_;
  std::string tail_label_;
  ShardLayout layout_;
  at::Tensor flat_, reduce_, gradients_;
  std::vector<at::Tensor> bound_, stepped_;  // bound_: the parameters in binding order
  BucketedReduce* bucketed_ = nullptr;
};

}  // namespace

ShardLayout shard_layout(int world, std::int64_t elements, std::int64_t tail) {
  ShardLayout layout;
  layout.world = world;
  layout.elements = elements;
  layout.slice = (elements + world - 1) / world;
  layout.tail = tail;
  return layout;
}

std::vector<std::int64_t> move_into_flat(const std::vector<at::Tensor>& trainable,
                                         at::Tensor& flat) {
  std::vector<std::int64_t> offsets(trainable.size(), 0);
  std::int64_t offset = 0;
  for (std::size_t k = trainable.size(); k-- > 0;) {
    at::Tensor p = trainable[k];
    if (p.scalar_type() != at::kFloat) {
      throw UsageError("--shard: the trainable parameters must be float32 (one is " +
                       std::string(c10::toString(p.scalar_type())) +
                       "); --precision bf16 and fp16 keep float32 parameters");
    }
    const std::int64_t n = p.numel();
    at::Tensor place = flat.narrow(0, offset, n).view(p.sizes());
    {
      const at::NoGradGuard no_grad;
      place.copy_(p);
    }
    p.set_data(place);
    offsets[k] = offset;
    offset += n;
  }
  return offsets;
}

const char* to_string(ShardLevel level) {
  switch (level) {
    case ShardLevel::kNone:
      return "none";
    case ShardLevel::kOptimizer:
      return "optimizer";
    case ShardLevel::kGradients:
      return "gradients";
  }
  return "?";
}

FixedBytes fixed_bytes(ShardLevel level, const ShardLayout& layout, int rank, int state_floats,
                       std::int64_t largest, std::int64_t staging) {
  constexpr std::int64_t kFloat = sizeof(float);
  if (level == ShardLevel::kNone || layout.world == 1) {
    const std::int64_t p = layout.elements;
    return {kFloat * p, kFloat * (p + layout.tail), kFloat * state_floats * p, 0};
  }
  const std::int64_t padded = layout.world * layout.slice;
  const std::int64_t mine = layout.end(rank) - layout.begin(rank);
  const std::int64_t gradients =
      level == ShardLevel::kOptimizer ? padded + layout.tail : mine + layout.tail + staging;
  const std::int64_t transient = level == ShardLevel::kGradients ? kFloat * largest : 0;
  return {kFloat * padded, kFloat * gradients, kFloat * state_floats * mine, transient};
}

std::unique_ptr<Reducer> replicated_reducer(comm::Communicator& comm, ReduceBuffer& buffer,
                                            const std::vector<at::Tensor>& trainable,
                                            ReduceLayout::Handle gradient_region,
                                            ReduceLayout::Handle buffer_region,
                                            ReduceLayout::Handle control_region) {
  return std::make_unique<ReplicatedReduce>(comm, buffer, trainable, gradient_region, buffer_region,
                                            control_region);
}

std::unique_ptr<Reducer> sharded_reducer(comm::Communicator& gradient_comm,
                                         comm::Communicator& control_comm,
                                         const std::vector<at::Tensor>& trainable,
                                         std::int64_t buffer_floats, std::int64_t control_floats,
                                         c10::Device device) {
  return std::make_unique<ShardedReduce>(gradient_comm, control_comm, trainable, buffer_floats,
                                         control_floats, device);
}

}  // namespace autoaccum::train
