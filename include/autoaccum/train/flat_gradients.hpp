// FlatGradients: every parameter's gradient is a view into one persistent flat buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace autoaccum::train {

// One float32 buffer holds all gradients back to back, then `extra_slots` control values that
// travel in the same all-reduce (the OOM flags, loss, ...). Autograd accumulates into the
// existing views in place, so the all-reduce needs no packing or unpacking copies.
class FlatGradients {
 public:
  FlatGradients(const std::vector<at::Tensor>& parameters, std::int64_t extra_slots);

  at::Tensor& buffer() noexcept { return buffer_; }  // gradients, then slots
  at::Tensor gradients() const;                      // the gradient part only
  float* slots() noexcept { return slots_; }         // extra_slots floats after the gradients
  std::int64_t gradient_count() const noexcept { return gradient_count_; }
  std::int64_t slot_count() const noexcept { return slot_count_; }
  void zero();  // gradients and slots
  // Whether every parameter's .grad() still is its view into the buffer (autograd can replace a
  // gradient instead of accumulating into it; the trainer checks after the first backward).
  bool intact() const;

 private:
  std::vector<at::Tensor> parameters_;
  at::Tensor buffer_;
  float* slots_ = nullptr;
  std::int64_t gradient_count_ = 0;
  std::int64_t slot_count_ = 0;
};

}  // namespace autoaccum::train
