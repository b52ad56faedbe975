// The optimizer step in pieces (OptimizerStep) against LibTorch's own whole-tensor step, on the
// same parameters and gradients, interleaved, one thread: the time and the temporaries' bytes.
//   build/tests/bench/bench_optimizer_step [sgd|adamw] [elements of the largest tensor] [reps]
// Prints one JSON object: {"optimizer":..,"elements":..,"pieces_ms":..,"libtorch_ms":..,
// "pieces_extra_bytes":..,"libtorch_extra_bytes":..}
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "bench_timing.hpp"

using autoaccum::bench::median;
using autoaccum::bench::now;

namespace {

// Three square-ish layers of `largest` elements each and a bias, gradients in one flat buffer.
std::vector<at::Tensor> make_params(std::int64_t largest, at::Tensor& gradients) {
  std::vector<at::Tensor> params;
  for (std::int64_t n : {largest, largest, largest, std::int64_t{4096}})
    params.push_back(torch::randn({n}).requires_grad_(true));
  std::int64_t total = 0;
  for (const auto& p : params)
    total += p.numel();
  gradients = torch::randn({total});
  std::int64_t offset = 0;
  for (auto& p : params) {
    p.mutable_grad() = gradients.narrow(0, offset, p.numel());
    offset += p.numel();
  }
  return params;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string optimizer = argc > 1 ? argv[1] : "adamw";
  const std::int64_t largest = argc > 2 ? std::atoll(argv[2]) : std::int64_t{8} << 20;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 9;
  at::set_num_threads(1);
  autoaccum::memory::install_cpu_budget(0);  // counts live bytes and their peak
  autoaccum::train::TrainOptions o;
  o.optimizer = optimizer;
  o.lr = 1e-3;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  at::Tensor ours_grad, theirs_grad;
  auto ours = make_params(largest, ours_grad);
  auto theirs = make_params(largest, theirs_grad);
  autoaccum::train::OptimizerStep step(o, ours);
  std::unique_ptr<torch::optim::Optimizer> reference;
  if (optimizer == "sgd") {
    reference = std::make_unique<torch::optim::SGD>(
        theirs, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  } else {
    reference = std::make_unique<torch::optim::AdamW>(
        theirs, torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  }
  reference->step();  // LibTorch makes its state at the first step
  (void)step.apply(ours_grad, 1.0, o.lr);
  std::vector<double> mine, libtorch;
  std::int64_t mine_extra = 0, libtorch_extra = 0;
  for (int r = 0; r < reps; ++r) {
    std::int64_t live = autoaccum::memory::cpu_live_bytes();
    autoaccum::memory::reset_cpu_peak();
    double start = now();
    (void)step.apply(ours_grad, 1.0, o.lr);
    mine.push_back(now() - start);
    mine_extra = std::max(mine_extra, autoaccum::memory::cpu_peak_bytes() - live);
    live = autoaccum::memory::cpu_live_bytes();
    autoaccum::memory::reset_cpu_peak();
    start = now();
    reference->step();
    libtorch.push_back(now() - start);
    libtorch_extra = std::max(libtorch_extra, autoaccum::memory::cpu_peak_bytes() - live);
  }
  std::printf(
      "{\"optimizer\": \"%s\", \"elements\": %lld, \"pieces_ms\": %.3f, \"libtorch_ms\": %.3f, "
      "\"pieces_extra_bytes\": %lld, \"libtorch_extra_bytes\": %lld}\n",
      optimizer.c_str(), static_cast<long long>(3 * largest + 4096), 1e3 * median(mine),
      1e3 * median(libtorch), static_cast<long long>(mine_extra),
      static_cast<long long>(libtorch_extra));
  return 0;
}
