// Precision: autocast scopes and the start-up GEMM probe.
#include "autoaccum/train/model/precision.hpp"

#include <torch/torch.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "autoaccum/compat/torch_compat.hpp"
#include "autoaccum/core/error.hpp"

namespace autoaccum::train {
namespace {

// One build for every x86-64 CPU, the widest vectors chosen at load time (GCC's function
// multi-versioning); elsewhere the compiler's own vectorisation.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AUTOACCUM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define AUTOACCUM_VECTOR_CLONES
#endif

// out[i] += in[i] for bf16 bit patterns: a bf16 value is the upper half of the fp32 one.
AUTOACCUM_VECTOR_CLONES void add_bf16_into_fp32(float* __restrict out,
                                                const std::uint16_t* __restrict in,
                                                std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    out[i] += value;
  }
}

}  // namespace

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  if (text == "fp16") return Precision::kFp16;
  throw UsageError("--precision: '" + text + "' is not one of fp32, bf16, fp16");
}

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

c10::ScalarType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return c10::kBFloat16;
    case Precision::kFp16:
      return c10::kHalf;
    case Precision::kFp32:
      break;
  }
  return c10::kFloat;
}

bool fp16_emulated_on_cpu() {
  const char* value = std::getenv("AUTOACCUM_FP16_ON_CPU");
  return value && std::string(value) == "1";
}

c10::ScalarType autocast_dtype_for(Precision precision, c10::DeviceType device) {
  if (precision == Precision::kFp16 && device != c10::DeviceType::CUDA && fp16_emulated_on_cpu())
    return c10::kBFloat16;
  return compute_dtype(precision);
}

std::string precision_problem(Precision precision, const c10::Device& device) {
  if (precision == Precision::kFp16 && !device.is_cuda() && !fp16_emulated_on_cpu()) {
    return "--precision fp16 needs --device cuda: LibTorch has no fast fp16 kernels on CPUs; use "
           "--precision bf16 there";
  }
  return "";
}

AutocastScope::AutocastScope(Precision precision, c10::DeviceType device) : device_(device) {
  if (precision == Precision::kFp32) return;
  const compat::AutocastState before = compat::autocast_state(device);
  was_enabled_ = before.enabled;
  was_dtype_ = before.dtype;
  compat::set_autocast_state(device, {true, autocast_dtype_for(precision, device)});
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // The outermost scope drops the cached lower-precision copies of the weights, as Python's
  // torch.autocast does on exit: the next forward casts the updated weights afresh.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_state(device_, {was_enabled_, was_dtype_});
}

CastCacheScope::CastCacheScope(Precision precision) : active_(precision != Precision::kFp32) {
  if (active_) at::autocast::increment_nesting();
}

CastCacheScope::~CastCacheScope() {
  if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

at::Tensor cached_weight_cast(const at::Tensor& weight, c10::ScalarType dtype) {
  return at::autocast::cached_cast(dtype, weight, weight.device().type());
}

void accumulate_fp32(at::Tensor& accumulated, const at::Tensor& addend) {
  TORCH_CHECK(accumulated.scalar_type() == at::kFloat, "accumulate_fp32: accumulated is ",
              accumulated.scalar_type(), ", not Float");
  TORCH_CHECK(accumulated.sizes() == addend.sizes(), "accumulate_fp32: shapes ",
              accumulated.sizes(), " and ", addend.sizes(), " differ");
  if (addend.scalar_type() != at::kBFloat16 || !accumulated.device().is_cpu() ||
      !addend.device().is_cpu() || !accumulated.is_contiguous() || !addend.is_contiguous()) {
    accumulated.add_(addend);
    return;
  }
  float* out = accumulated.data_ptr<float>();
  const auto* in = reinterpret_cast<const std::uint16_t*>(addend.data_ptr<at::BFloat16>());
  // --threads: split as LibTorch splits its own elementwise work.
  at::parallel_for(0, accumulated.numel(), at::internal::GRAIN_SIZE,
                   [&](std::int64_t begin, std::int64_t end) {
                     add_bf16_into_fp32(out + begin, in + begin, end - begin);
                   });
}

bool autocast_enabled(c10::DeviceType device) {
  return compat::autocast_state(device).enabled;
}

c10::ScalarType autocast_dtype(c10::DeviceType device) {
  return compat::autocast_state(device).dtype;
}

std::string describe_precision(Precision precision, bool on_gpu, double gemm_speedup,
                               const std::string& probe_failure) {
  const std::string lower = precision == Precision::kFp16 ? "fp16" : "bf16";
  std::ostringstream speedup;
  // An emulated precision's products can run at a few hundredths of fp32's speed.
  speedup << std::fixed << std::setprecision(gemm_speedup < 0.1 ? 2 : 1) << gemm_speedup << "x";
  const std::string where = on_gpu ? "this GPU's " : "this CPU's ";
  if (precision == Precision::kFp32) {
    if (gemm_speedup < 1.5) return "precision fp32";
    return "precision fp32 (" + where + "bf16 matrix products run " + speedup.str() +
           " as fast: --precision bf16 may train faster)";
  }
  std::string line = std::string("precision ") + to_string(precision) +
                     ": forward and loss under autocast, parameters and gradients fp32; ";
  if (!probe_failure.empty())
    return line + "the " + lower + " probe failed on this device: " + probe_failure;
  line += where + lower + " matrix products run " + speedup.str() + " as fast as fp32's";
  if (gemm_speedup < 1.5)
    line += " (no fast " + lower + " here: expect little speed-up, only memory)";
  return line;
}

double gemm_speedup(c10::ScalarType dtype, const c10::Device& device, std::int64_t n) {
  torch::NoGradGuard no_grad;
  const auto one_product = [](const at::Tensor& a, const at::Tensor& b) {
    const auto start = std::chrono::steady_clock::now();
    (void)a.mm(b).sum().item<double>();  // .item() waits for a GPU
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // The best of `reps` products after a warm-up of two calls and at least `warm_ms`.
  const auto best_of = [&](c10::ScalarType type, std::int64_t size, int warm_ms, int reps) {
    const auto options = torch::TensorOptions().dtype(type).device(device);
    // Not randn: the probe must not draw from the generator that initialises the model.
    const at::Tensor a = torch::linspace(-1.0, 1.0, size * size, options).reshape({size, size});
    const at::Tensor b = a.t().contiguous();
    const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(warm_ms);
    for (int call = 0; call < 2 || std::chrono::steady_clock::now() < warm_until; ++call)
      (void)one_product(a, b);
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep)
      best = std::min(best, one_product(a, b));
    return std::max(best, 1e-9);
  };
  // Warm-up, for at least 60 ms: on this project's CPUs the first four or five fp32 products
  // of a process run at less than half speed (kernel selection, first-touch pages, clocks),
  // which a single warm-up call left in the timing and doubled the reported ratio in about
  // half the runs (measured: 6.5 ms, then 2.8 ms per 512^3 product from the sixth on).
  const double fp32 = best_of(c10::kFloat, n, 60, 5);
  // A precision a CPU only emulates is 15-70x slower than fp32 (an AVX2 CPU without bf16
  // instructions: 53 ms per 512^3 bf16 product with LibTorch 1.13, 212 ms with 2.11, against
  // 3 ms in fp32), and timing it at n (two warm-ups and five products) added 0.4-1.5 s to
  // every run's start. So it is first compared at 128^3 (0.85 and 1.8 ms a product there,
  // against 0.06 ms in fp32): at under a fifth of fp32's speed that ratio is the answer, far
  // below the 1.5x at which bf16 pays. Fast bf16 and GPUs (where 128^3 only measures launches)
  // go on to the full timing. Warmed up first, so that a first call's kernel selection or JIT
  // compilation is not mistaken for emulation.
  if (device.is_cpu() && n > 128) {
    const double small = best_of(c10::kFloat, 128, 0, 3) / best_of(dtype, 128, 0, 3);
    if (small < 0.2) return small;
  }
  return fp32 / best_of(dtype, n, 60, 5);
}

}  // namespace autoaccum::train
