// Reducer: the replicated all-reduce (whole, or in buckets) and the sharded reduce-scatter.
#include "autoaccum/train/reduce/reducer.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>

#include "autoaccum/core/error.hpp"
#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reduce_buffer.hpp"

namespace autoaccum::train {
namespace {

class ReplicatedReduce final : public Reducer {
 public:
  ReplicatedReduce(comm::Communicator& comm, ReduceBuffer& buffer, BucketedReduce* bucketed,
                   std::vector<at::Tensor> trainable, ReduceLayout::Handle gradients,
                   ReduceLayout::Handle buffers, ReduceLayout::Handle control)
      : comm_(comm),
        buffer_(buffer),
        bucketed_(bucketed),
        trainable_(std::move(trainable)),
        gradients_(gradients),
        buffers_(buffers),
        control_(control) {}

  void begin() override {
    buffer_.zero();
    if (bucketed_) bucketed_->begin();
  }
  void arm(const at::Tensor& loss) override {
    if (bucketed_) bucketed_->arm(loss);
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

 private:
  comm::Communicator& comm_;
  ReduceBuffer& buffer_;
  BucketedReduce* bucketed_;
  std::vector<at::Tensor> trainable_;
  ReduceLayout::Handle gradients_, buffers_, control_;
};

// Where the gradient of a parameter that crosses a slice boundary goes: runs before the
// parameter's gradient accumulator, adds what backward computed for it into the pieces of the
// chunks it crosses (around the tails between them) and passes nothing on, so the accumulator
// does nothing and the parameter needs no gradient tensor of its own.
class AccumulateAcrossSlices final : public torch::autograd::FunctionPreHook {
 public:
  AccumulateAcrossSlices(at::Tensor buffer, const ShardLayout& layout, std::int64_t offset)
      : buffer_(std::move(buffer)), layout_(layout), offset_(offset) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (grads.empty() || !grads[0].defined()) return grads;
    const at::NoGradGuard no_grad;
    const at::Tensor flat = grads[0].reshape(-1);
    const std::int64_t n = flat.numel();
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t x = offset_ + done;
      const std::int64_t chunk = x / layout_.slice;
      const std::int64_t within = x - chunk * layout_.slice;
      const std::int64_t count = std::min(n - done, layout_.slice - within);
      buffer_.narrow(0, chunk * layout_.chunk() + layout_.tail + within, count)
          .add_(flat.narrow(0, done, count));
      done += count;
    }
    return {at::Tensor()};  // an undefined gradient: the accumulator adds nothing
  }

 private:
  at::Tensor buffer_;
  ShardLayout layout_;
  std::int64_t offset_;
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
        control_floats_(control_floats) {
    std::int64_t elements = 0;
    std::vector<std::int64_t> sizes;
    for (const auto& p : trainable) {
      if (p.scalar_type() != at::kFloat) {
        throw UsageError("--shard optimizer: the trainable parameters must be float32 (one is " +
                         std::string(c10::toString(p.scalar_type())) +
                         "); --precision bf16 and fp16 keep float32 parameters");
      }
      sizes.push_back(p.numel());
      elements += p.numel();
    }
    layout_ = shard_layout(gradient_comm.size(), elements, buffer_floats + control_floats);
    const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
    const std::int64_t world = layout_.world;
    // The parameters move into one flat buffer, in order; each keeps its identity (the model
    // and the optimizer hold the same tensors), only its data is now a view.
    flat_ = at::zeros({world * layout_.slice}, options);
    reduce_ = at::zeros({world * layout_.chunk()}, options);
    const std::vector<std::size_t> crossing = layout_.crossing(sizes);
    std::int64_t offset = 0;
    std::size_t next_crossing = 0;
    for (std::size_t i = 0; i < trainable.size(); ++i) {
      at::Tensor p = trainable[i];
      const std::int64_t n = p.numel();
      at::Tensor place = flat_.narrow(0, offset, n).view(p.sizes());
      {
        const at::NoGradGuard no_grad;
        place.copy_(p);
      }
      p.set_data(place);
      if (next_crossing < crossing.size() && crossing[next_crossing] == i) {
        ++next_crossing;
        p.mutable_grad() = at::Tensor();
        auto accumulator = torch::autograd::impl::grad_accumulator(p);
        accumulator->add_pre_hook(
            std::make_unique<AccumulateAcrossSlices>(reduce_, layout_, offset));
        accumulators_.push_back(std::move(accumulator));  // the parameter holds it weakly
      } else {
        const std::int64_t chunk = layout_.slice > 0 ? offset / layout_.slice : 0;
        const std::int64_t at =
            chunk * layout_.chunk() + layout_.tail + (offset - chunk * layout_.slice);
        p.mutable_grad() = reduce_.narrow(0, at, n).view(p.sizes());
        bound_.push_back(p);
      }
      offset += n;
    }
    const std::int64_t mine = layout_.end(rank_) - layout_.begin(rank_);
    gradients_ = reduce_.narrow(0, rank_ * layout_.chunk() + layout_.tail, mine);
    at::Tensor slice = flat_.narrow(0, layout_.begin(rank_), mine).detach();
    slice.set_requires_grad(true);
    slice.mutable_grad() = gradients_;
    stepped_.push_back(slice);
  }

  void begin() override { reduce_.zero_(); }
  at::Tensor part(Part part) override {
    const std::int64_t start = rank_ * layout_.chunk();
    return part == Part::kBuffers ? reduce_.narrow(0, start, buffer_floats_)
                                  : reduce_.narrow(0, start + buffer_floats_, control_floats_);
  }
  void reduce() override {
    // This rank's tail into every other chunk: whichever rank a chunk goes to receives every
    // rank's contribution.
    const at::Tensor tail = reduce_.narrow(0, rank_ * layout_.chunk(), layout_.tail);
    for (int j = 0; j < layout_.world; ++j) {
      if (j != rank_ && layout_.tail > 0)
        reduce_.narrow(0, j * layout_.chunk(), layout_.tail).copy_(tail);
    }
    comm_.reduce_scatter_sum(reduce_.data_ptr<float>(), static_cast<std::size_t>(layout_.chunk()),
                             "gradient reduce-scatter");
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
    comm_.reduce_scatter_sum(reduce_.data_ptr<float>(), static_cast<std::size_t>(layout_.chunk()));
    comm_.allgather_in_place(flat_.data_ptr<float>(), static_cast<std::size_t>(layout_.slice));
  }

 private:
  comm::Communicator& comm_;
  comm::Communicator& control_comm_;
  int rank_;
  std::int64_t buffer_floats_, control_floats_;
  ShardLayout layout_;
  at::Tensor flat_, reduce_, gradients_;
  std::vector<at::Tensor> bound_, stepped_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // with our hooks
};

}  // namespace

std::vector<std::size_t> ShardLayout::crossing(const std::vector<std::int64_t>& sizes) const {
  std::vector<std::size_t> which;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > 0 && slice > 0 && offset / slice != (offset + sizes[i] - 1) / slice)
      which.push_back(i);
    offset += sizes[i];
  }
  return which;
}

ShardLayout shard_layout(int world, std::int64_t elements, std::int64_t tail) {
  ShardLayout layout;
  layout.world = world;
  layout.elements = elements;
  layout.slice = (elements + world - 1) / world;
  layout.tail = tail;
  return layout;
}

FixedBytes replicated_fixed_bytes(std::int64_t elements, std::int64_t tail, int state_floats) {
  constexpr std::int64_t kFloat = sizeof(float);
  return {kFloat * elements, kFloat * (elements + tail), kFloat * state_floats * elements};
}

FixedBytes sharded_fixed_bytes(const ShardLayout& layout, int rank, int state_floats) {
  // A parameter crossing a slice boundary holds no gradient tensor of its own: nothing to add.
  constexpr std::int64_t kFloat = sizeof(float);
  return {kFloat * layout.world * layout.slice, kFloat * layout.world * layout.chunk(),
          kFloat * state_floats * (layout.end(rank) - layout.begin(rank))};
}

std::unique_ptr<Reducer> replicated_reducer(comm::Communicator& comm, ReduceBuffer& buffer,
                                            BucketedReduce* bucketed,
                                            const std::vector<at::Tensor>& trainable,
                                            ReduceLayout::Handle gradient_region,
                                            ReduceLayout::Handle buffer_region,
                                            ReduceLayout::Handle control_region) {
  return std::make_unique<ReplicatedReduce>(comm, buffer, bucketed, trainable, gradient_region,
                                            buffer_region, control_region);
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
