// accumulating_linear: the weight-gradient GEMM accumulates into the gradient buffer (beta = 1).
#include "autoaccum/train/fused_linear.hpp"

#include <torch/torch.h>

namespace autoaccum::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

class AccumulatingLinear : public torch::autograd::Function<AccumulatingLinear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    TORCH_CHECK(x.dim() == 2, "accumulating_linear: input must be 2-D, got ", x.dim(), "-D");
    ctx->save_for_backward({x});
    // The parameters themselves (not copies): backward reads and extends their .grad().
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["bias"] = bias;
    return at::addmm(bias, x, weight.t());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor weight = ctx->saved_data["weight"].toTensor();
    at::Tensor bias = ctx->saved_data["bias"].toTensor();
    const at::Tensor g = grad_outputs[0].contiguous();  // [rows, out]
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = g.mm(weight);
    if (ctx->needs_input_grad(1)) {
      at::Tensor& existing = weight.mutable_grad();
      if (existing.defined())
        existing.addmm_(g.t(), x);  // gradient += g^T x, inside the GEMM
      else
        grad_weight = g.t().mm(x);
    }
    if (ctx->needs_input_grad(2)) {
      at::Tensor& existing = bias.mutable_grad();
      if (existing.defined())
        existing.add_(g.sum(0));
      else
        grad_bias = g.sum(0);
    }
    return {grad_x, grad_weight, grad_bias};
  }
};

}  // namespace

at::Tensor accumulating_linear(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias) {
  return AccumulatingLinear::apply(x, weight, bias);
}

}  // namespace autoaccum::train
