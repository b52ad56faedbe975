// The memory module: the CPU memory budget, byte counters, OOM detection and OOM injection.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace autoaccum::memory {

// "96MiB", "1.5GiB", "512MB", "1000000" (bytes), "none"/"0" (no limit). Binary units KiB, MiB,
// GiB, TiB; decimal kB, MB, GB, TB; case-insensitive. Anything else is a UsageError naming
// `option`.
std::int64_t parse_size(const std::string& text, const std::string& option = "--memory-limit");
// 100663296 -> "96.0 MiB".
std::string format_bytes(std::int64_t bytes);

// Installs (once per process) a CPU allocator that counts live tensor bytes and their peak, and
// throws c10::OutOfMemoryError when an allocation would take live bytes past the limit, as a
// GPU's allocator does. A limit of 0 means none (bytes are still counted). Safe to call again
// to change the limit. Makes the CPU the device that live_bytes()/peak_bytes() describe.
void install_cpu_budget(std::int64_t limit_bytes);
bool cpu_budget_installed() noexcept;
std::int64_t cpu_limit() noexcept;
std::int64_t cpu_live_bytes() noexcept;
std::int64_t cpu_peak_bytes() noexcept;
void reset_cpu_peak() noexcept;  // peak <- live

// While one is alive, the calling thread's CPU tensors are host staging memory, outside the
// budget: neither counted nor limited. The prefetcher reads slabs under one, as on a GPU the
// slab is pinned host memory and only the model, activations, gradients and optimizer state
// take device memory. (Kernels that use raw_allocate must not run under it.)
class UncountedScope {
 public:
  UncountedScope() noexcept;
  ~UncountedScope();
  UncountedScope(const UncountedScope&) = delete;
  UncountedScope& operator=(const UncountedScope&) = delete;
};

// The device whose memory the trainer measures and limits. By default the CPU budget above.
// use_cuda_device() switches to a CUDA device's caching allocator: a limit becomes the
// per-process memory fraction (limit / the device's total memory), so a small limit behaves like
// a small GPU, and live/peak bytes come from the allocator's statistics. Throws
// BackendUnavailable when this build has no CUDA (AUTOACCUM_HAVE_CUDA).
void use_cuda_device(int device, std::int64_t limit_bytes);
bool cuda_built() noexcept;  // a CUDA LibTorch
// GPUs this process sees through LibTorch; 0 without a CUDA LibTorch, a driver or a GPU (NCCL
// plays no part: a CUDA LibTorch without a system NCCL still sees its GPUs). `problem`: why the
// driver could not be asked (count 0), so that --device auto does not quietly run on the CPU.
struct CudaDevices {
  int count = 0;
  std::string problem;
};
CudaDevices cuda_devices() noexcept;
// LibTorch's current stream (a cudaStream_t) on the CUDA device in use; nullptr on the CPU.
void* current_cuda_stream();
std::int64_t cuda_total_bytes(int device);
// Device-aware: the CUDA device's counters after use_cuda_device(), else the CPU budget's.
std::int64_t live_bytes() noexcept;
std::int64_t peak_bytes() noexcept;
void reset_peak() noexcept;
// Waits for the device's queued work (a no-op on CPU): before a collective that runs on another
// stream reads buffers the model's stream wrote.
void synchronize_device();

// Keeps freed large blocks in the process instead of returning them to the OS on every free
// (glibc's default for blocks above its mmap threshold), so each step does not re-fault its
// pages: measured 22k -> 42k samples/s for an MLP at micro-batch 512 on these machines.
void tune_malloc() noexcept;

// Whether `e` says memory ran out: c10::OutOfMemoryError, std::bad_alloc, or a c10::Error whose
// message is an out-of-memory message of older LibTorch, CUDA, cuBLAS or cuDNN.
bool is_out_of_memory(const std::exception& e) noexcept;

// How many allocations the device in use has refused so far in this process: the CPU budget's
// refusals, or the CUDA caching allocator's out-of-memory count. It grows whether or not the
// error that followed kept its type: the TorchScript interpreter, for one, rethrows an
// allocator's c10::OutOfMemoryError as a plain std::runtime_error.
// (A failure to read the device's statistics is thrown: an attempt cannot then tell an
// out-of-memory from another error, and must not guess.)
std::int64_t refused_allocations();

// Watches one stretch of work (an attempt at a step): an exception is an out-of-memory when
// is_out_of_memory() says so, or when the device refused an allocation since the watch began
// and the exception is not one of autoaccum's own (autoaccum::Error). Detection does not rest
// on message text or exception type alone.
class OomWatch {
 public:
  OomWatch();
  bool explains(const std::exception& e) const;
  bool refused() const;  // an allocation was refused since the watch began

 private:
  std::int64_t refused_at_start_;
};

// Throws c10::OutOfMemoryError with `message` (used by the injector and tests).
[[noreturn]] void throw_out_of_memory(const std::string& message);

// After an agreed OOM: returns cached blocks (emptyCache on the CUDA device in use; malloc_trim on
// the CPU).
void release_cached_memory() noexcept;

// --inject-oom rank=R,above=M[,step=S][,backward=1]: rank R throws the same OOM as a real one at
// the end of the forward pass (activations allocated) whenever the micro-batch has more than M
// rows (at optimizer step S only, when given); with backward=1, in the backward pass instead,
// when the first parameter's gradient is computed (the last layers' gradients exist by then).
struct OomInjection {
  int rank = 0;
  std::int64_t above = 0;
  std::optional<std::int64_t> step;
  bool backward = false;
  bool fires(int this_rank, std::int64_t micro_batch_rows, std::int64_t this_step) const noexcept {
    return this_rank == rank && micro_batch_rows > above && (!step || *step == this_step);
  }
};
// Several injections separated by ';' ("rank=1,above=8;rank=2,above=4,step=3").
std::vector<OomInjection> parse_oom_injections(const std::string& text);

}  // namespace autoaccum::memory
