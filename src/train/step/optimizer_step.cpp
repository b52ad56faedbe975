// OptimizerStep: SGD and AdamW as LibTorch computes them, with their state allocated up front
// (LibTorch's optimizers keep it, and its archive), stepped in pieces of bounded size.
#include "autoaccum/train/step/optimizer_step.hpp"

#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autoaccum/compat/torch_compat.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/step/step_agreement.hpp"

namespace autoaccum::train {
namespace {

// LibTorch creates a parameter's state at its first step; creating it here, with the values
// that first step would start from, gives the same updates (SGD: a zero momentum buffer times
// momentum plus the gradient is the gradient; AdamW: step 0 and zero moments).
void allocate_state(torch::optim::Optimizer& optimizer, const std::vector<at::Tensor>& params,
                    const TrainOptions& options) {
  auto& state = optimizer.state();
  using Map = std::remove_reference_t<decltype(state)>;
  torch::NoGradGuard no_grad;
  for (const auto& p : params) {
    const auto key = compat::optimizer_state_key<Map>(p);
    if (options.optimizer == "sgd") {
      if (options.momentum == 0) continue;  // plain SGD keeps no state
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(torch::zeros_like(p, at::MemoryFormat::Preserve));
      state[key] = std::move(s);
    } else {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(0);
      s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
      s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
      state[key] = std::move(s);
    }
  }
}

// The pieces the update walks through: each temporary it makes (AdamW's denominator, SGD's
// gradient plus weight decay) is at most this many elements.
constexpr std::int64_t kPieceElements = std::int64_t{1} << 20;

// `t` flat, when it can be without a copy; else undefined (the caller steps it whole).
at::Tensor flat_or_undefined(const at::Tensor& t) {
  return t.is_contiguous() ? t.view({-1}) : at::Tensor();
}

// Calls step(param, grad, state...) on matching pieces of at most kPieceElements of each tensor
// (all flat views of the same length), or once on the whole tensors when one is not contiguous.
template <typename Step>
void in_pieces(const std::vector<at::Tensor>& tensors, Step&& step) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) {
    flat.push_back(flat_or_undefined(t));
    if (!flat.back().defined()) {
      step(tensors);
      return;
    }
  }
  const std::int64_t n = flat.front().numel();
  std::vector<at::Tensor> piece(flat.size());
  for (std::int64_t begin = 0; begin < n; begin += kPieceElements) {
    const std::int64_t length = std::min(kPieceElements, n - begin);
    for (std::size_t i = 0; i < flat.size(); ++i)
      piece[i] = flat[i].narrow(0, begin, length);
    step(piece);
  }
}

}  // namespace

std::int64_t OptimizerStep::temporary_bytes() const {
  const auto& group = optimizer_->param_groups().at(0);
  if (options_.optimizer == "sgd") {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    if (o.weight_decay() == 0 && !o.nesterov()) return 0;  // every operation in place
  }
  std::int64_t largest = 0;
  for (const auto& p : group.params()) {
    const std::int64_t elements =
        p.is_contiguous() ? std::min(p.numel(), kPieceElements) : p.numel();
    largest = std::max(largest, elements * static_cast<std::int64_t>(p.element_size()));
  }
  return largest;
}

double square_sum(const at::Tensor& values) {
  if (values.numel() == 0) return 0.0;
  if (!values.device().is_cpu() || values.scalar_type() != at::kFloat || !values.is_contiguous()) {
    // In pieces, so that the double copy stays small; the pieces' sums in order, on the device.
    const at::Tensor flat = values.reshape({-1});
    at::Tensor total = at::zeros({}, flat.options().dtype(at::kDouble));
    for (std::int64_t begin = 0; begin < flat.numel(); begin += kPieceElements) {
      const std::int64_t length = std::min(kPieceElements, flat.numel() - begin);
      total.add_(flat.narrow(0, begin, length).to(at::kDouble).square().sum());
    }
    return total.item<double>();
  }
  const float* data = values.data_ptr<float>();
  const std::int64_t n = values.numel();
  constexpr std::int64_t kBlock = std::int64_t{1} << 16;
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> sums(static_cast<std::size_t>(blocks), 0.0);
  at::parallel_for(0, blocks, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b) {
      const std::int64_t begin = b * kBlock;
      const std::int64_t end = std::min(n, begin + kBlock);
      // Four lanes in a fixed pattern: fast, and the same order on every machine.
      double lane[4] = {0.0, 0.0, 0.0, 0.0};
      std::int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        for (int k = 0; k < 4; ++k) {
          const auto x = static_cast<double>(data[i + k]);
          lane[k] += x * x;
        }
      }
      for (; i < end; ++i) {
        const auto x = static_cast<double>(data[i]);
        lane[0] += x * x;
      }
      sums[static_cast<std::size_t>(b)] = (lane[0] + lane[1]) + (lane[2] + lane[3]);
    }
  });
  double total = 0.0;
  for (double s : sums)
    total += s;
  return total;
}

OptimizerStep::OptimizerStep(const TrainOptions& options, const std::vector<at::Tensor>& trainable,
                             std::function<double(double)> total)
    : options_(options), total_(std::move(total)) {
  if (options.optimizer == "sgd") {
    optimizer_ =
        std::make_unique<torch::optim::SGD>(trainable, torch::optim::SGDOptions(options.lr)
                                                           .momentum(options.momentum)
                                                           .weight_decay(options.weight_decay));
  } else if (options.optimizer == "adamw") {
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        trainable, torch::optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
  } else {
    throw UsageError("--optimizer: '" + options.optimizer + "' is not one of sgd, adamw");
  }
  allocate_state(*optimizer_, trainable, options);
}

OptimizerStep::~OptimizerStep() = default;

OptimizerStep::Result OptimizerStep::apply(const at::Tensor& gradients, double loss, double lr) {
  // One read-only pass: the squares' sum is NaN or Inf when any element is, and its root is the
  // norm clipping needs; the same bits on every rank (square_sum).
  const double squares = square_sum(gradients);
  const double norm = std::sqrt(total_ ? total_(squares) : squares);
  if (!step_is_finite(loss, norm))
    return options_.on_nonfinite == "skip" ? Result::kSkipped : Result::kStop;
  if (options_.clip_grad_norm > 0 && norm > options_.clip_grad_norm)
    gradients.mul_(options_.clip_grad_norm / (norm + 1e-6));
  for (auto& group : optimizer_->param_groups())
    group.options().set_lr(lr);
  try {
    step_in_pieces(lr);
  } catch (const std::exception& e) {
    if (!memory::is_out_of_memory(e)) throw;
    // The state was allocated at setup; only a temporary can fail here, and a smaller
    // micro-batch would not shrink it.
    throw Error("out of memory in the optimizer step (limit " +
                    memory::format_bytes(options_.memory_limit) +
                    "): the parameters and optimizer state leave no room for its temporaries",
                ExitCode::kOutOfMemory);
  }
  return Result::kStepped;
}

// LibTorch's updates, element for element (torch::optim::SGD::step, AdamW::step: the same
// operations in the same order, so the same bits), made piece by piece.
void OptimizerStep::step_in_pieces(double lr) {
  torch::NoGradGuard no_grad;
  const auto& params = optimizer_->param_groups().at(0).params();
  const bool adamw = options_.optimizer == "adamw";
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.grad().defined()) continue;
    if (adamw) {
      step_adamw(p, static_cast<torch::optim::AdamWParamState&>(param_state(i)), lr);
    } else {
      step_sgd(p, i, lr);
    }
  }
}

void OptimizerStep::step_sgd(const at::Tensor& p, std::size_t index, double lr) {
  const auto& o =
      static_cast<const torch::optim::SGDOptions&>(optimizer_->param_groups().at(0).options());
  const double momentum = o.momentum(), decay = o.weight_decay(), dampening = o.dampening();
  const bool nesterov = o.nesterov();
  std::vector<at::Tensor> tensors{p, p.grad()};
  if (momentum != 0) {
    tensors.push_back(
        static_cast<torch::optim::SGDParamState&>(param_state(index)).momentum_buffer());
  }
  in_pieces(tensors, [&](const std::vector<at::Tensor>& t) {
    at::Tensor d_p = t[1];
    if (decay != 0) d_p = d_p.add(t[0], decay);  // a temporary: a piece
    if (momentum != 0) {
      t[2].mul_(momentum).add_(d_p, 1 - dampening);
      d_p = nesterov ? d_p.add(t[2], momentum) : t[2];
    }
    t[0].add_(d_p, -lr);
  });
}

void OptimizerStep::step_adamw(const at::Tensor& p, torch::optim::AdamWParamState& state,
                               double lr) {
  const auto& o =
      static_cast<const torch::optim::AdamWOptions&>(optimizer_->param_groups().at(0).options());
  const auto [beta1, beta2] = o.betas();
  const double eps = o.eps(), decay = o.weight_decay();
  state.step(state.step() + 1);
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(state.step()));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(state.step()));
  const double step_size = lr / bias_correction1;
  const double root2 = std::sqrt(bias_correction2);
  in_pieces({p, p.grad(), state.exp_avg(), state.exp_avg_sq()},
            [&](const std::vector<at::Tensor>& t) {
              if (decay != 0) t[0].mul_(1 - lr * decay);
              t[2].mul_(beta1).add_(t[1], 1 - beta1);
              t[3].mul_(beta2).addcmul_(t[1], t[1], 1 - beta2);
              at::Tensor denom = t[3].sqrt();  // the one temporary: a piece
              denom.div_(root2).add_(eps);
              t[0].addcdiv_(t[2], denom, -step_size);
            });
}

std::vector<std::string> OptimizerStep::state_kinds() const {
  if (options_.optimizer == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (options_.momentum != 0) return {"momentum_buffer"};
  return {};
}

std::size_t OptimizerStep::stepped_count() const {
  return optimizer_->param_groups().at(0).params().size();
}

torch::optim::OptimizerParamState& OptimizerStep::param_state(std::size_t index) const {
  const at::Tensor& p = optimizer_->param_groups().at(0).params().at(index);
  auto& state = optimizer_->state();
  using Map = std::remove_reference_t<decltype(state)>;
  return *state.at(compat::optimizer_state_key<Map>(p));
}

at::Tensor OptimizerStep::state(std::size_t index, const std::string& kind) const {
  auto& s = param_state(index);
  if (options_.optimizer == "adamw") {
    auto& adam = static_cast<torch::optim::AdamWParamState&>(s);
    if (kind == "exp_avg") return adam.exp_avg();
    if (kind == "exp_avg_sq") return adam.exp_avg_sq();
  } else if (kind == "momentum_buffer") {
    return static_cast<torch::optim::SGDParamState&>(s).momentum_buffer();
  }
  throw Error("internal: no optimizer state of kind '" + kind + "'");
}

std::int64_t OptimizerStep::step_count() const {
  if (options_.optimizer != "adamw" || stepped_count() == 0) return 0;
  return static_cast<torch::optim::AdamWParamState&>(param_state(0)).step();
}

void OptimizerStep::set_step_count(std::int64_t steps) {
  if (options_.optimizer != "adamw") return;
  for (std::size_t i = 0; i < stepped_count(); ++i)
    static_cast<torch::optim::AdamWParamState&>(param_state(i)).step(steps);
}

void OptimizerStep::load(const std::string& bytes, const c10::Device& device) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in, device);
  optimizer_->load(archive);
}

}  // namespace autoaccum::train
