// FlatGradients: gradient views into one buffer.
#include "autoaccum/train/flat_gradients.hpp"

#include <ATen/ATen.h>

namespace autoaccum::train {

FlatGradients::FlatGradients(const std::vector<at::Tensor>& parameters, std::int64_t extra_slots)
    : parameters_(parameters), slot_count_(extra_slots) {
  for (const auto& p : parameters_)
    gradient_count_ += p.numel();
  buffer_ = at::zeros({gradient_count_ + extra_slots}, at::TensorOptions().dtype(at::kFloat));
  std::int64_t offset = 0;
  for (auto& p : parameters_) {
    p.mutable_grad() = buffer_.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
  }
  slots_ = buffer_.data_ptr<float>() + gradient_count_;
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
