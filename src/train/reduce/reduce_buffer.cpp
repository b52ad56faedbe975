// ReduceBuffer: regions of one tensor; gradient views bound into one of them.
#include "autoaccum/train/reduce/reduce_buffer.hpp"

#include <ATen/ATen.h>

#include <stdexcept>

namespace autoaccum::train {

ReduceBuffer::ReduceBuffer(ReduceLayout layout, c10::Device device) : layout_(std::move(layout)) {
  buffer_ = at::zeros({layout_.size()}, at::TensorOptions().dtype(at::kFloat).device(device));
}

void ReduceBuffer::bind_gradients(const std::vector<at::Tensor>& parameters,
                                  ReduceLayout::Handle region) {
  const auto& r = layout_[region];
  std::int64_t offset = r.offset;
  for (const auto& p : parameters) {
    if (offset + p.numel() > r.offset + r.count)
      throw std::logic_error("reduce buffer: the gradient region is too small");
    at::Tensor parameter = p;  // shares the TensorImpl: setting its grad sets the model's
    parameter.mutable_grad() = buffer_.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
  }
  bound_ = parameters;
  bound_offset_ = r.offset;
  bound_count_ = r.count;
}

bool gradients_inside(const std::vector<at::Tensor>& parameters, const at::Tensor& region) {
  const auto* begin = static_cast<const char*>(region.data_ptr());
  const auto* end = begin + region.numel() * static_cast<std::int64_t>(region.element_size());
  for (const auto& p : parameters) {
    const auto& g = p.grad();
    if (!g.defined()) return false;
    const auto* data = static_cast<const char*>(g.data_ptr());
    if (data < begin || data >= end) return false;
  }
  return true;
}

bool ReduceBuffer::gradients_intact() const {
  return gradients_inside(bound_, buffer_.narrow(0, bound_offset_, bound_count_));
}

at::Tensor ReduceBuffer::view(ReduceLayout::Handle region) const {
  const auto& r = layout_[region];
  return buffer_.narrow(0, r.offset, r.count);
}

void ReduceBuffer::zero() {
  buffer_.zero_();
}

}  // namespace autoaccum::train
