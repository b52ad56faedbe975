// FlatGradients: gradient views into one buffer.
#include "autoaccum/train/flat_gradients.hpp"

#include <ATen/ATen.h>

namespace autoaccum::train {

FlatGradients::FlatGradients(const std::vector<at::Tensor>& parameters, std::int64_t extra_slots)
    : parameters_(parameters), slot_count_(extra_slots) {
  for (const auto& p : parameters_)
    gradient_count_ += p.numel();
  const auto device = parameters_.empty() ? at::Device(at::kCPU) : parameters_.front().device();
  buffer_ = at::zeros({gradient_count_ + extra_slots},
                      at::TensorOptions().dtype(at::kFloat).device(device));
  std::int64_t offset = 0;
  for (auto& p : parameters_) {
    p.mutable_grad() = buffer_.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
  }
}

void FlatGradients::write_slots(const float* host) {
  if (slot_count_ == 0) return;
  buffer_.narrow(0, gradient_count_, slot_count_)
      .copy_(at::from_blob(const_cast<float*>(host), {slot_count_}, at::kFloat));
}

void FlatGradients::read_slots(float* host) const {
  if (slot_count_ == 0) return;
  at::from_blob(host, {slot_count_}, at::kFloat)
      .copy_(buffer_.narrow(0, gradient_count_, slot_count_));
}

at::Tensor FlatGradients::slot(std::int64_t index) const {
  return buffer_.narrow(0, gradient_count_ + index, 1);
}

at::Tensor FlatGradients::gradients() const {
  return buffer_.narrow(0, 0, gradient_count_);
}

void FlatGradients::zero() {
  buffer_.zero_();
}

bool FlatGradients::intact() const {
  const auto* begin = static_cast<const char*>(buffer_.data_ptr());
  const auto* end = begin + gradient_count_ * static_cast<std::int64_t>(sizeof(float));
  for (const auto& p : parameters_) {
    const auto& g = p.grad();
    if (!g.defined()) return false;
    const auto* data = static_cast<const char*>(g.data_ptr());
    if (data < begin || data >= end) return false;
  }
  return true;
}

}  // namespace autoaccum::train
