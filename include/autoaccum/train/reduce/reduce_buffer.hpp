// ReduceBuffer: the step's one all-reduced buffer; gradients are views into it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "autoaccum/train/reduce/reduce_layout.hpp"

namespace autoaccum::train {

// One float32 buffer, on the parameters' device, laid out by a ReduceLayout. The trainable
// parameters' .grad() are views into its gradient region, so autograd accumulates in place and
// the all-reduce needs no packing or unpacking copies.
class ReduceBuffer {
 public:
  ReduceBuffer(ReduceLayout layout, c10::Device device);

  // Makes each parameter's gradient a view into `region` (its size must be their total).
  void bind_gradients(const std::vector<at::Tensor>& parameters, ReduceLayout::Handle region);
  // Whether every bound parameter's .grad() still is its view (autograd can replace a gradient
  // instead of accumulating into it; the trainer checks after the first backward).
  bool gradients_intact() const;

  const ReduceLayout& layout() const noexcept { return layout_; }
  at::Tensor& all() noexcept { return buffer_; }
  at::Tensor view(ReduceLayout::Handle region) const;  // a 1-D view of one region
  void zero();

 private:
  ReduceLayout layout_;
  at::Tensor buffer_;
  std::vector<at::Tensor> bound_;
  std::int64_t bound_offset_ = 0, bound_count_ = 0;
};

// Whether every parameter's .grad() is defined and lies inside `region` (a 1-D tensor).
bool gradients_inside(const std::vector<at::Tensor>& parameters, const at::Tensor& region);

}  // namespace autoaccum::train
