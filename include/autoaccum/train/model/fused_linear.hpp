// A linear layer whose weight gradient is accumulated by the GEMM itself.
#pragma once

#include <ATen/core/Tensor.h>

namespace autoaccum::train {

// y = x W^T + b for a 2-D x, differentiable. In backward, when weight.grad() (or bias.grad())
// already exists, the new gradient is added into it in place: the weight-gradient GEMM runs with
// beta = 1 on the existing buffer instead of writing a fresh matrix that autograd then adds
// (one pass over the weights and one temporary fewer per micro-batch; with gradient
// accumulation over k micro-batches that is k passes per step). Where the gradient is not yet
// defined it is returned to autograd as usual. The result equals at::linear's in value.
at::Tensor accumulating_linear(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias);

}  // namespace autoaccum::train
