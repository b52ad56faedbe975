// OptimizerStep: LibTorch's SGD and AdamW with their state allocated up front.
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

}  // namespace

double square_sum(const at::Tensor& values) {
  if (values.numel() == 0) return 0.0;
  if (!values.device().is_cpu() || values.scalar_type() != at::kFloat || !values.is_contiguous())
    return values.to(at::kDouble).square().sum().item<double>();
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
    optimizer_->step();
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
