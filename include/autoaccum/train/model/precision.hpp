// Precision: --precision fp32|bf16|fp16, as LibTorch's autocast around each forward and loss.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace autoaccum::train {

enum class Precision { kFp32, kBf16, kFp16 };

Precision parse_precision(const std::string& text);  // UsageError naming --precision
const char* to_string(Precision precision);
// The dtype autocast lowers to: kBFloat16 or kHalf; kFloat for fp32.
c10::ScalarType compute_dtype(Precision precision);

// Why `precision` cannot run on `device` ("" when it can): fp16 needs a CUDA device (LibTorch
// has no fast fp16 kernels on CPUs, and 1.13 none at all).
std::string precision_problem(Precision precision, const c10::Device& device);

// Tests only: AUTOACCUM_FP16_ON_CPU=1 lets --precision fp16 run on a CPU with its products in
// bf16. Loss scaling does not depend on the dtype, so its agreement across ranks, checkpoints
// and run log are testable without a GPU.
bool fp16_emulated_on_cpu();
// The dtype autocast uses for `precision` on `device`: compute_dtype, except emulated fp16.
c10::ScalarType autocast_dtype_for(Precision precision, c10::DeviceType device);

// While alive, operations on `device` run under LibTorch's autocast in `precision`'s dtype,
// exactly as inside Python's `torch.autocast(device, dtype)`: matrix products and convolutions
// in the lower precision, losses and reductions where autocast keeps them in fp32. Parameters
// stay fp32 (autocast casts a copy, cached until the outermost scope ends). For fp32 it does
// nothing. Scopes nest; the previous state comes back at the end.
class AutocastScope {
 public:
  AutocastScope(Precision precision, c10::DeviceType device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType device_;
  bool was_enabled_ = false;
  c10::ScalarType was_dtype_ = c10::kBFloat16;
};

// While alive, autocast's copies of the weights in the lower precision are kept from one
// AutocastScope to the next, then dropped: the trainer holds one over an attempt, so a step of k
// micro-batches casts each weight once instead of k times (the weights cannot change within a
// step; the values, and so the results, are the same). For fp32 it does nothing.
class CastCacheScope {
 public:
  explicit CastCacheScope(Precision precision);
  ~CastCacheScope();
  CastCacheScope(const CastCacheScope&) = delete;
  CastCacheScope& operator=(const CastCacheScope&) = delete;

 private:
  bool active_;
};

// A parameter in autocast's `dtype`, through autocast's cache (the cast is made once per
// CastCacheScope, or per AutocastScope without one).
at::Tensor cached_weight_cast(const at::Tensor& weight, c10::ScalarType dtype);

// accumulated += addend, for an fp32 `accumulated` and an `addend` of the same shape in bf16,
// fp16 or fp32: the values at::Tensor::add_ gives (a bf16 or fp16 value is exact in fp32, so
// each element is the same one fp32 addition). This is the pass lower precision adds to every
// micro-batch's weight gradient; for contiguous bf16 on a CPU it runs as a vectorised loop
// instead of add_'s type-promoting path (docs/design.md, "Precision").
void accumulate_fp32(at::Tensor& accumulated, const at::Tensor& addend);

// Whether autocast is on for `device` now, and its dtype (the fused linear layer asks).
bool autocast_enabled(c10::DeviceType device);
c10::ScalarType autocast_dtype(c10::DeviceType device);

// The banner's precision line (without the "autoaccum: " prefix): the precision, what runs in
// it, and what the probe found (`gemm_speedup`, or `probe_failure` when it threw). An fp32 run
// on a device whose bf16 products are 1.5x faster or more gets a hint to try bf16.
std::string describe_precision(Precision precision, bool on_gpu, double gemm_speedup,
                               const std::string& probe_failure);

// A short probe of this device's matrix products: how many times faster an n x n x n product
// runs in `dtype` than in fp32 (about 0.15 s; on a CPU that only emulates `dtype`, a 128^3
// comparison answers in about 0.1 s; a few MiB freed at the end; run it before a CPU memory
// budget applies). Tells the banner whether bf16 pays on this machine.
double gemm_speedup(c10::ScalarType dtype, const c10::Device& device, std::int64_t n = 512);

}  // namespace autoaccum::train
