// The CPU memory budget allocator and the OOM helpers.
#include "autoaccum/memory/memory.hpp"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>
#include <stdexcept>

#include "autoaccum/compat/torch_compat.hpp"
#include "autoaccum/core/drill.hpp"
#include "autoaccum/core/error.hpp"

#if AUTOACCUM_HAVE_CUDA
#include <ATen/Functions.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace autoaccum::memory {
namespace {

// Blocks are counted by malloc_usable_size on both allocation and release, so the count is exact
// without a header; data pointer == context, as raw_allocate() (used by some kernels) requires.
constexpr std::size_t kAlignment = 64;  // as the default CPU allocator

thread_local int uncounted_depth = 0;  // > 0: this thread's allocations are host staging

class CpuBudget final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) AUTOACCUM_ALLOCATE_CONST override {
    void* block = nullptr;
    if (posix_memalign(&block, kAlignment, std::max<size_t>(bytes, 1)) != 0) {
      refused_.fetch_add(1);
      throw_out_of_memory("cannot allocate " + format_bytes(static_cast<std::int64_t>(bytes)) +
                          " from the system");
    }
    if (uncounted_depth > 0) {
      return {block, block, &CpuBudget::release_uncounted, c10::Device(c10::DeviceType::CPU)};
    }
    const auto size = static_cast<std::int64_t>(malloc_usable_size(block));
    const std::int64_t live = live_.fetch_add(size) + size;
    const std::int64_t limit = limit_.load(std::memory_order_relaxed);
    if (limit > 0 && live > limit) {
      live_.fetch_sub(size);
      refused_.fetch_add(1);
      std::free(block);
      throw_out_of_memory("autoaccum memory limit: cannot allocate " +
                          format_bytes(static_cast<std::int64_t>(bytes)) + " with " +
                          format_bytes(live - size) + " in use (limit " + format_bytes(limit) +
                          ")");
    }
    std::int64_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return {block, block, &CpuBudget::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CpuBudget::release; }

#if AUTOACCUM_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  static void release(void* block) {
    if (!block) return;
    instance().live_.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(block)));
    std::free(block);
  }

  static void release_uncounted(void* block) {
    std::free(block);
  }

  static CpuBudget& instance() {
    static CpuBudget* budget = new CpuBudget();  // never destroyed: tensors may outlive main
    return *budget;
  }

  mutable std::atomic<std::int64_t> live_{0};
  mutable std::atomic<std::int64_t> peak_{0};
  mutable std::atomic<std::int64_t> refused_{0};  // allocations refused for the limit
  std::atomic<std::int64_t> limit_{0};
};

std::atomic<bool> installed{false};
std::atomic<int> cuda_device_in_use{-1};  // -1: the CPU budget is the device

}  // namespace

std::int64_t parse_size(const std::string& text, const std::string& option) {
  std::string lower;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (lower == "none" || lower == "0") return 0;
  const auto bad = [&] {
    return UsageError(option + ": '" + text +
                      "' is not a size (examples: 96MiB, 1.5GiB, 512MB, 1000000, none)");
  };
  std::size_t used = 0;
  double number = 0;
  try {
    number = std::stod(lower, &used);
  } catch (const std::logic_error&) {  // not a number, or out of range
    throw bad();
  }
  const std::string unit = lower.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "b")
    scale = 1;
  else if (unit == "kib" || unit == "k")
    scale = 1024.0;
  else if (unit == "mib" || unit == "m")
    scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb")
    scale = 1e3;
  else if (unit == "mb")
    scale = 1e6;
  else if (unit == "gb")
    scale = 1e9;
  else if (unit == "tb")
    scale = 1e12;
  else
    throw bad();
  const double bytes = number * scale;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 9.0e18) throw bad();
  return static_cast<std::int64_t>(bytes);
}

std::string format_bytes(std::int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::abs(value) >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

UncountedScope::UncountedScope() noexcept {
  ++uncounted_depth;
}
UncountedScope::~UncountedScope() {
  --uncounted_depth;
}

void install_cpu_budget(std::int64_t limit_bytes) {
  auto& budget = CpuBudget::instance();
  budget.limit_.store(limit_bytes);
  cuda_device_in_use.store(-1);  // the CPU is the measured device until use_cuda_device()
  if (!installed.exchange(true)) c10::SetCPUAllocator(&budget, /*priority=*/100);
}

bool cpu_budget_installed() noexcept {
  return installed.load();
}
std::int64_t cpu_limit() noexcept {
  return CpuBudget::instance().limit_.load();
}
std::int64_t cpu_live_bytes() noexcept {
  return CpuBudget::instance().live_.load();
}
std::int64_t cpu_peak_bytes() noexcept {
  return CpuBudget::instance().peak_.load();
}
void reset_cpu_peak() noexcept {
  auto& budget = CpuBudget::instance();
  budget.peak_.store(budget.live_.load());
}

bool cuda_built() noexcept {
  return AUTOACCUM_HAVE_CUDA != 0;
}

#if AUTOACCUM_HAVE_CUDA
namespace {
// Index 0 of the allocator's stat arrays is the aggregate over pool types in every LibTorch
// version that has them (1.13 to 2.x); named StatType::AGGREGATE in each.
constexpr std::size_t kAggregate = 0;
// Device indices are int in LibTorch 1.x and c10::DeviceIndex in 2.x; the narrow type fits both.
c10::DeviceIndex index(int device) {
  return static_cast<c10::DeviceIndex>(device);
}
}  // namespace

std::int64_t cuda_total_bytes(int device) {
  return static_cast<std::int64_t>(at::cuda::getDeviceProperties(index(device))->totalGlobalMem);
}

CudaDevices cuda_devices() noexcept {
  try {
    return {static_cast<int>(c10::cuda::device_count()), ""};
  } catch (const std::exception& e) {
    return {0, e.what()};
  }
}

void* current_cuda_stream() {
  const int device = cuda_device_in_use.load();
  if (device < 0) return nullptr;
  return at::cuda::getCurrentCUDAStream(index(device)).stream();
}

void use_cuda_device(int device, std::int64_t limit_bytes) {
  c10::cuda::set_device(index(device));
  // The caching allocator exists only once CUDA is initialised (LibTorch 2.x throws "Allocator
  // not initialized" otherwise): a first tiny tensor on the device does that in every version.
  (void)at::empty({1}, at::TensorOptions().device(c10::Device(c10::kCUDA, index(device))));
  // Set every time (1.0 without a limit): the fraction outlives a Trainer in the same process.
  const double total = static_cast<double>(cuda_total_bytes(device));
  const double fraction =
      limit_bytes > 0 ? std::min(1.0, static_cast<double>(limit_bytes) / total) : 1.0;
  c10::cuda::CUDACachingAllocator::emptyCache();  // the new cap applies to what is reserved
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index(device));
  cuda_device_in_use.store(device);
  c10::cuda::CUDACachingAllocator::resetPeakStats(index(device));
}

// Allocated bytes (all pools) of the device in use.
auto allocated(int device) {  // the Stat type moved namespaces in LibTorch 2.x
  return c10::cuda::CUDACachingAllocator::getDeviceStats(index(device)).allocated_bytes[kAggregate];
}

std::int64_t live_bytes() noexcept {
  const int device = cuda_device_in_use.load();
  return device < 0 ? cpu_live_bytes() : allocated(device).current;
}

std::int64_t peak_bytes() noexcept {
  const int device = cuda_device_in_use.load();
  return device < 0 ? cpu_peak_bytes() : allocated(device).peak;
}

void reset_peak() noexcept {
  const int device = cuda_device_in_use.load();
  if (device < 0) return reset_cpu_peak();
  c10::cuda::CUDACachingAllocator::resetPeakStats(index(device));
}

void synchronize_device() {
  if (cuda_device_in_use.load() >= 0) c10::cuda::device_synchronize();
}

std::int64_t refused_allocations() {
  const int device = cuda_device_in_use.load();
  if (device < 0) return CpuBudget::instance().refused_.load();
  // The caching allocator counts the allocations it could not serve even after freeing its
  // cache: each is one c10::OutOfMemoryError, whatever wraps it later.
  return c10::cuda::CUDACachingAllocator::getDeviceStats(index(device)).num_ooms;
}
#else
CudaDevices cuda_devices() noexcept {
  return {};
}
void* current_cuda_stream() {
  return nullptr;
}
std::int64_t cuda_total_bytes(int) {
  throw BackendUnavailable("this build has no CUDA support (see docs/gpu.md)");
}
void use_cuda_device(int, std::int64_t) {
  throw BackendUnavailable("this build has no CUDA support (see docs/gpu.md)");
}
std::int64_t live_bytes() noexcept {
  return cpu_live_bytes();
}
std::int64_t peak_bytes() noexcept {
  return cpu_peak_bytes();
}
void reset_peak() noexcept {
  reset_cpu_peak();
}
void synchronize_device() {}
std::int64_t refused_allocations() {
  return CpuBudget::instance().refused_.load();
}
#endif

OomWatch::OomWatch() : refused_at_start_(refused_allocations()) {}

bool OomWatch::refused() const {
  return refused_allocations() > refused_at_start_;
}

bool OomWatch::explains(const std::exception& e) const {
  if (is_out_of_memory(e)) return true;
  // The TorchScript interpreter rethrows a failed operation as a plain std::runtime_error (its
  // message holds the traceback), so the type cannot be asked; autoaccum's own errors are
  // decisions, never an allocator's.
  return dynamic_cast<const Error*>(&e) == nullptr && refused();
}

void tune_malloc() noexcept {
  // 1 GiB: blocks below it come from the heap and stay there after free; trimming only above it.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

bool is_out_of_memory(const std::exception& e) noexcept {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  if (dynamic_cast<const c10::Error*>(&e)) {
    const std::string text = e.what();
    // cuBLAS and cuDNN allocate workspaces outside the caching allocator: their failures
    // arrive as status codes in the message.
    for (const char* needle : {"CUDA out of memory", "CUDA error: out of memory",
                               "DefaultCPUAllocator: can't allocate memory", "HIP out of memory",
                               "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED"}) {
      if (text.find(needle) != std::string::npos) return true;
    }
  }
  return false;
}

void throw_out_of_memory(const std::string& message) {
  C10_THROW_ERROR(OutOfMemoryError, message);
}

void release_cached_memory() noexcept {
#if AUTOACCUM_HAVE_CUDA
  if (cuda_device_in_use.load() >= 0) {
    // Blocks cached at the failed size would fragment the smaller attempt's memory.
    try {
      c10::cuda::CUDACachingAllocator::emptyCache();
    } catch (...) {
    }
    return;
  }
#endif
  // The CPU budget keeps no cache of its own beyond glibc's heap.
  malloc_trim(0);
}

std::vector<OomInjection> parse_oom_injections(const std::string& text) {
  std::vector<OomInjection> all;
  for (const auto& item : core::parse_drill(
           "--inject-oom", text, {"rank", "above", "step", "backward"}, {"rank", "above"},
           {"rank", "above", "step", "backward"}, "rank=R,above=M[,step=S][,backward=1]")) {
    OomInjection injection;
    injection.rank = static_cast<int>(item.integer("rank"));
    injection.above = item.integer("above");
    if (item.values.count("step")) injection.step = item.integer("step");
    if (item.values.count("backward")) {
      if (item.integer("backward") > 1)
        throw UsageError("--inject-oom: '" + item.text + "': backward must be 0 or 1");
      injection.backward = item.integer("backward") == 1;
    }
    all.push_back(injection);
  }
  return all;
}

}  // namespace autoaccum::memory
