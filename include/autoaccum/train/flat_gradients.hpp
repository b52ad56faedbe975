// FlatGradients: every parameter's gradient is a view into one persistent flat buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace autoaccum::train {

// One float32 buffer, on the parameters' device, holds all gradients back to back, then
// `extra_slots` control values that travel in the same all-reduce (the OOM flags, loss, ...).
// Autograd accumulates into the existing views in place, so the all-reduce needs no packing or
// unpacking copies.
class FlatGradients {
 public:
  FlatGradients(const std::vector<at::Tensor>& parameters, std::int64_t extra_slots);

  at::Tensor& buffer() noexcept { return buffer_; }  // gradients, then slots
  at::Tensor gradients() const;                      // the gradient part only
  // The slots live with the gradients (on the GPU for --device cuda): they are written from and
  // read back into host arrays of slot_count() floats, one copy each way per attempt.
  void write_slots(const float* host);
  void read_slots(float* host) const;
  at::Tensor slot(std::int64_t index) const;  // a 1-element view, for device-side values
  std::int64_t gradient_count() const noexcept { return gradient_count_; }
  std::int64_t slot_count() const noexcept { return slot_count_; }
  void zero();  // gradients and slots
  // Whether every parameter's .grad() still is its view into the buffer (autograd can replace a
  // gradient instead of accumulating into it; the trainer checks after the first backward).
  bool intact() const;

 private:
  std::vector<at::Tensor> parameters_;
  at::Tensor buffer_;
  std::int64_t gradient_count_ = 0;
  std::int64_t slot_count_ = 0;
};

}  // namespace autoaccum::train
