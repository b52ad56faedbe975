// accumulating_linear: the weight-gradient GEMM accumulates into the gradient buffer (beta = 1).
#include "autoaccum/train/model/fused_linear.hpp"

#include <torch/torch.h>

#include "autoaccum/train/model/precision.hpp"

namespace autoaccum::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

class AccumulatingLinear : public torch::autograd::Function<AccumulatingLinear> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    TORCH_CHECK(x.dim() == 2, "accumulating_linear: input must be 2-D, got ", x.dim(), "-D");
    // Under autocast (--precision bf16/fp16) the product runs in the lower precision, as
    // at::linear's would: the input and a copy of the weight are cast here, and backward runs
    // its products on the same copies. The parameters and their gradients stay fp32.
    at::Tensor xc = x, wc = weight, bc = bias;
    const auto device = x.device().type();
    if (autocast_enabled(device)) {
      const auto dtype = autocast_dtype(device);
      xc = x.to(dtype);
      wc = cached_weight_cast(weight, dtype);  // once per step under the trainer's scope
      bc = cached_weight_cast(bias, dtype);
    }
    ctx->save_for_backward({xc, wc});
    // The parameters themselves (not copies): backward reads and extends their .grad().
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["bias"] = bias;
    return at::addmm(bc, xc, wc.t());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];   // the input as the product saw it (fp32, or bf16/fp16)
    const at::Tensor& wc = saved[1];  // the weight as the product saw it
    at::Tensor weight = ctx->saved_data["weight"].toTensor();
    at::Tensor bias = ctx->saved_data["bias"].toTensor();
    const at::Tensor g = grad_outputs[0].contiguous();  // [rows, out]
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = g.mm(wc);
    if (ctx->needs_input_grad(1)) {
      at::Tensor& existing = weight.mutable_grad();
      if (existing.defined() && existing.scalar_type() == g.scalar_type()) {
        existing.addmm_(g.t(), x);  // gradient += g^T x, inside the GEMM
      } else if (existing.defined()) {
        // Lower precision: the product in bf16/fp16, added into the fp32 gradient (as autograd
        // adds at::linear's). Measured 2.2-3.6x faster than casting g and x up for an fp32
        // addmm_ (docs/design.md, "Precision").
        accumulate_fp32(existing, g.t().mm(x));
      } else {
        grad_weight = g.t().mm(x);
      }
    }
    if (ctx->needs_input_grad(2)) {
      at::Tensor& existing = bias.mutable_grad();
      if (existing.defined())
        accumulate_fp32(existing, g.sum(0));
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
