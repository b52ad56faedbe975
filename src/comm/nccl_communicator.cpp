// NcclCommunicator: NCCL bootstrapped over MPI; never blocks forever on a collective.
#include "autoaccum/comm/nccl_communicator.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/error.hpp"

#if AUTOACCUM_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>
#endif

namespace autoaccum::comm {

#if AUTOACCUM_HAVE_NCCL

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;          // NCCL's own
  cudaStream_t compute_stream = nullptr;  // the model's; nullptr: the legacy default stream
  cudaEvent_t produced = nullptr;         // recorded on the compute stream before a collective
  cudaEvent_t reduced = nullptr;          // recorded on NCCL's stream after it
  int device = -1;
  bool aborted = false;

  void abort() noexcept {
    if (comm && !aborted) ncclCommAbort(comm);
    aborted = true;
  }
};

namespace {

std::string nccl_text(ncclResult_t result) {
  return ncclGetErrorString(result);
}

// NCCL allocates device buffers of its own (at initialisation and at the first collective of
// each kind). A failure there is memory, not the network: it says so and ends with the
// out-of-memory exit code.
bool nccl_ran_out_of_memory(ncclComm_t comm, ncclResult_t result) {
  if (result != ncclUnhandledCudaError && result != ncclSystemError) return false;
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  const std::string text = last ? last : "";
  return text.find("out of memory") != std::string::npos ||
         cudaPeekAtLastError() == cudaErrorMemoryAllocation;
}

void release_cuda_handles(NcclCommunicator::Impl& impl) noexcept {
  if (impl.produced) cudaEventDestroy(impl.produced);
  if (impl.reduced) cudaEventDestroy(impl.reduced);
  if (impl.stream) cudaStreamDestroy(impl.stream);
  impl.produced = impl.reduced = nullptr;
  impl.stream = nullptr;
}

[[noreturn]] void throw_nccl_failure(NcclCommunicator::Impl& impl, const char* what, int rank,
                                     ncclResult_t bad) {
  const bool memory = nccl_ran_out_of_memory(impl.comm, bad);
  const char* last = impl.comm ? ncclGetLastError(impl.comm) : nullptr;
  const std::string detail = last && *last ? std::string(" (") + last + ")" : std::string();
  impl.abort();
  if (memory) {
    throw Error("rank " + std::to_string(rank) + ": " + what +
                    ": NCCL ran out of GPU memory for its own buffers" + detail +
                    "; lower --memory-limit so that NCCL's buffers fit beside it",
                ExitCode::kOutOfMemory);
  }
  throw CommError("rank " + std::to_string(rank) + ": " + what + " failed: " + nccl_text(bad) +
                  detail);
}

// Waits until `done()` or NCCL reports an error; aborts the communicator past
// nccl_wait_limit (none with --collective-timeout 0), so a peer that died cannot leave this rank
// waiting forever. The watchdog's thread, armed by the caller, ends the job first and names the
// missing ranks; this deadline is the fallback. Polls back off (PollBackoff), so a long
// all-reduce does not take a core from the prefetch thread.
template <class Done>
void wait_for(NcclCommunicator::Impl& impl, const char* what, int rank, Done done) {
  const Watchdog& dog = watchdog();
  const std::optional<std::chrono::milliseconds> limit = nccl_wait_limit(dog);
  const auto start = std::chrono::steady_clock::now();
  PollBackoff backoff;
  for (;;) {
    if (done()) return;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(impl.comm, &state);
    if (query != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      throw_nccl_failure(impl, what, rank, query != ncclSuccess ? query : state);
    }
    if (limit && std::chrono::steady_clock::now() - start > *limit) {
      impl.abort();
      TimeoutReport report;
      report.collective = what;
      report.timeout = *limit;
      report.context = dog.context();
      throw CollectiveTimeout("rank " + std::to_string(rank) + ": " + describe_timeout(report) +
                                  "; the NCCL communicator was aborted",
                              /*reporter=*/true);
    }
    backoff.pause();
  }
}

// The node-local rank picks among the GPUs this rank sees. With one GPU per task (Slurm's
// --gpus-per-task, or CUDA_VISIBLE_DEVICES set per rank) every rank sees a "device 0" that is a
// different physical GPU; ranks that really share one are found by PCI bus id
// (refuse_shared_gpus). Returns what went wrong ("" if nothing).
std::string choose_device(int local_rank, int& device, char (&bus)[64]) {
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  if (counted != cudaSuccess) {
    std::string problem =
        std::string("no usable CUDA device (") + cudaGetErrorString(counted) + ")";
    cudaGetLastError();  // clear the sticky error
    return problem;
  }
  if (devices == 0) return "no CUDA device";
  device = local_rank % devices;
  if (cudaDeviceGetPCIBusId(bus, sizeof bus - 1, device) != cudaSuccess) {
    return "cannot read the PCI bus id of CUDA device " + std::to_string(device) + ": " +
           cudaGetErrorString(cudaGetLastError());
  }
  return "";
}

// Every rank gets every (host, bus id) and finds the same duplicates, so all throw together.
void refuse_shared_gpus(MpiCommunicator& control, const char* bus) {
  char mine[192] = {};
  std::string host(256, '\0');
  gethostname(host.data(), host.size() - 1);
  std::snprintf(mine, sizeof mine, "%.120s %.60s", host.c_str(), bus);
  std::vector<char> all(sizeof mine * static_cast<std::size_t>(control.size()));
  control.allgather(mine, sizeof mine, all.data());
  for (int a = 0; a < control.size(); ++a) {
    for (int b = a + 1; b < control.size(); ++b) {
      const char* first = all.data() + sizeof mine * static_cast<std::size_t>(a);
      const char* second = all.data() + sizeof mine * static_cast<std::size_t>(b);
      if (std::strncmp(first, second, sizeof mine) == 0) {
        throw BackendUnavailable("NCCL backend unavailable: ranks " + std::to_string(a) + " and " +
                                 std::to_string(b) + " share the GPU " + std::string(first) +
                                 "; NCCL needs one GPU per rank");
      }
    }
  }
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> control)
    : control_(std::move(control)), impl_(std::make_unique<Impl>()) {
  const int rank = control_->rank();

  // Every rank must have its own GPU; agree before any NCCL call so all ranks fail together.
  char bus[64] = {};
  const std::string problem = choose_device(control_->local_rank(), impl_->device, bus);
  if (auto failure = agree_on_failure(*control_, problem)) {
    throw BackendUnavailable("NCCL backend unavailable: rank " + std::to_string(failure->rank) +
                             ": " + failure->message);
  }
  refuse_shared_gpus(*control_, bus);

  std::string setup_problem;
  if (cudaSetDevice(impl_->device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&impl_->produced, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&impl_->reduced, cudaEventDisableTiming) != cudaSuccess) {
    setup_problem = "cannot use CUDA device " + std::to_string(impl_->device) + ": " +
                    cudaGetErrorString(cudaGetLastError());
  }

  // Rank 0 makes the id; its success travels with it so a failure there stops every rank.
  struct {
    std::int64_t ok;
    ncclUniqueId id;
  } bootstrap{};
  if (rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&bootstrap.id);
    bootstrap.ok = made == ncclSuccess ? 1 : 0;
    if (made != ncclSuccess && setup_problem.empty()) {
      setup_problem = "ncclGetUniqueId failed: " + nccl_text(made);
    }
  }
  control_->broadcast(&bootstrap, sizeof bootstrap, 0);
  if (!bootstrap.ok && setup_problem.empty()) setup_problem = "rank 0 could not make an NCCL id";
  if (auto failure = agree_on_failure(*control_, setup_problem)) {
    release_cuda_handles(*impl_);
    throw CommError("NCCL set-up failed on rank " + std::to_string(failure->rank) + ": " +
                    failure->message);
  }

  // Non-blocking initialisation, so the wait below can time out instead of hanging. Whatever
  // fails here (an NCCL error, NCCL out of memory, the wait's deadline) every rank learns in one
  // agreement and throws together, with the failing rank's message and exit code, printed once.
  try {
    collectively(*control_, [&] {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t started =
          ncclCommInitRankConfig(&impl_->comm, control_->size(), bootstrap.id, rank, &config);
      if (started != ncclSuccess && started != ncclInProgress)
        throw_nccl_failure(*impl_, "ncclCommInitRankConfig", rank, started);
      wait_for(*impl_, "ncclCommInitRank", rank, [&] {
        ncclResult_t state = ncclInProgress;
        ncclCommGetAsyncError(impl_->comm, &state);
        return state == ncclSuccess;
      });
    });
  } catch (...) {
    impl_->abort();
    impl_->comm = nullptr;
    release_cuda_handles(*impl_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  if (impl_->comm && !impl_->aborted) {
    if (std::uncaught_exceptions() > 0) {
      // This rank is leaving on an error (its own, or one every rank agreed on): the others may
      // never join a clean destruction, and spmd_main's MPI_Abort must not wait behind it.
      impl_->abort();
    } else {
      // A clean end: a non-blocking communicator finishes its work in ncclCommFinalize, which
      // may answer ncclInProgress; it is polled with the collectives' deadline, and a
      // communicator that does not finish (or fails to) is aborted instead of destroyed.
      bool finished = cudaSetDevice(impl_->device) == cudaSuccess &&
                      cudaStreamSynchronize(impl_->stream) == cudaSuccess;
      if (finished) {
        const ncclResult_t started = ncclCommFinalize(impl_->comm);
        finished = started == ncclSuccess || started == ncclInProgress;
      }
      if (finished) {
        try {
          wait_for(*impl_, "ncclCommFinalize", rank(), [&] {
            ncclResult_t state = ncclInProgress;
            ncclCommGetAsyncError(impl_->comm, &state);
            return state == ncclSuccess;
          });
        } catch (const std::exception&) {
          finished = false;  // wait_for aborted the communicator
        }
      }
      cudaGetLastError();
      if (finished)
        ncclCommDestroy(impl_->comm);
      else
        impl_->abort();
    }
  }
  release_cuda_handles(*impl_);
}

void NcclCommunicator::abort() noexcept {
  if (impl_) impl_->abort();
}

void NcclCommunicator::set_compute_stream(void* stream) noexcept {
  impl_->compute_stream = static_cast<cudaStream_t>(stream);
}

namespace {

void cuda_check(int rank, cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw CommError("rank " + std::to_string(rank) + ": " + call +
                    " around ncclAllReduce failed: " + cudaGetErrorString(status));
  }
}

void throw_if_aborted(const NcclCommunicator::Impl& impl, int rank) {
  if (impl.aborted)
    throw CommError("rank " + std::to_string(rank) + ": NCCL communicator was aborted");
}

// Queues a collective on NCCL's stream after what the model's stream has queued (the backward
// pass that wrote the buffer), on the device: no host synchronisation. `issue` makes the NCCL
// call (named `call`) on that stream. Returns once NCCL has it on its stream.
template <class Issue>
void queue_on_nccl_stream(NcclCommunicator::Impl& impl, int rank, const char* call, Issue issue) {
  cuda_check(rank, cudaEventRecord(impl.produced, impl.compute_stream), "cudaEventRecord");
  cuda_check(rank, cudaStreamWaitEvent(impl.stream, impl.produced, 0), "cudaStreamWaitEvent");
  const ncclResult_t issued = issue();
  if (issued != ncclSuccess && issued != ncclInProgress) {
    throw_nccl_failure(impl, call, rank, issued);
  }
  // A non-blocking communicator may return ncclInProgress before the work is on the stream: an
  // event recorded now would precede it. Wait until NCCL says the call is enqueued.
  if (issued == ncclInProgress) {
    wait_for(impl, "NCCL collective (enqueue)", rank, [&] {
      ncclResult_t state = ncclInProgress;
      ncclCommGetAsyncError(impl.comm, &state);
      return state == ncclSuccess;
    });
  }
}

void queue_on_nccl_stream(NcclCommunicator::Impl& impl, int rank, void* data, std::size_t count,
                          ncclDataType_t type) {
  queue_on_nccl_stream(impl, rank, "ncclAllReduce", [&] {
    return ncclAllReduce(data, data, count, type, ncclSum, impl.comm, impl.stream);
  });
}

// Waits, with the deadline, until everything queued on NCCL's stream is done, and orders the
// model's stream after it.
void complete_on_nccl_stream(NcclCommunicator::Impl& impl, int rank, const char* call) {
  // The event follows everything queued on NCCL's stream: this collective and the buckets
  // queued before it (--overlap).
  cuda_check(rank, cudaEventRecord(impl.reduced, impl.stream), "cudaEventRecord");
  // The model's stream reads the reduced buffer only after NCCL wrote it ...
  cuda_check(rank, cudaStreamWaitEvent(impl.compute_stream, impl.reduced, 0),
             "cudaStreamWaitEvent");
  // ... and the host, which reads the agreed flags next, waits on the same event, with the
  // deadline: a peer that died shows as an event that never completes.
  wait_for(impl, call, rank, [&] {
    const cudaError_t state = cudaEventQuery(impl.reduced);
    if (state == cudaSuccess) return true;
    if (state != cudaErrorNotReady) {
      cudaGetLastError();
      throw CommError("rank " + std::to_string(rank) + ": CUDA error during " + call + ": " +
                      cudaGetErrorString(state));
    }
    return false;
  });
}

void device_allreduce(NcclCommunicator::Impl& impl, int rank, void* data, std::size_t count,
                      ncclDataType_t type) {
  throw_if_aborted(impl, rank);
  if (count == 0) return;
  queue_on_nccl_stream(impl, rank, data, count, type);
  complete_on_nccl_stream(impl, rank, "ncclAllReduce");
}

}  // namespace

void NcclCommunicator::do_allreduce_sum(float* data, std::size_t count, const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclAllReduce(float, sum)");
  device_allreduce(*impl_, rank(), data, count, ncclFloat32);
}

void NcclCommunicator::do_queue_allreduce_sum(float* data, std::size_t count, const char* what) {
  // The enqueue alone may wait (a non-blocking communicator's ncclInProgress).
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclAllReduce(float, sum) (queued)");
  throw_if_aborted(*impl_, rank());
  if (count > 0) queue_on_nccl_stream(*impl_, rank(), data, count, ncclFloat32);
}

void NcclCommunicator::do_allreduce_sum(double* data, std::size_t count, const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclAllReduce(double, sum)");
  device_allreduce(*impl_, rank(), data, count, ncclFloat64);
}

void NcclCommunicator::do_reduce_scatter_sum(float* data, std::size_t chunk, const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclReduceScatter(float, sum)");
  throw_if_aborted(*impl_, rank());
  if (chunk == 0) return;
  // In place: NCCL's result for this rank is its own chunk of the buffer.
  float* mine = data + static_cast<std::size_t>(rank()) * chunk;
  queue_on_nccl_stream(*impl_, rank(), "ncclReduceScatter", [&] {
    return ncclReduceScatter(data, mine, chunk, ncclFloat32, ncclSum, impl_->comm, impl_->stream);
  });
  complete_on_nccl_stream(*impl_, rank(), "ncclReduceScatter");
}

void NcclCommunicator::do_queue_reduce_sum(float* data, std::size_t count, int root,
                                           const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclReduce(float, sum) (queued)");
  throw_if_aborted(*impl_, rank());
  if (count == 0) return;
  // In place: the root's result lands where its input was.
  queue_on_nccl_stream(*impl_, rank(), "ncclReduce", [&] {
    return ncclReduce(data, data, count, ncclFloat32, ncclSum, root, impl_->comm, impl_->stream);
  });
}

void NcclCommunicator::do_reduce_sum(float* data, std::size_t count, int root, const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclReduce(float, sum)");
  throw_if_aborted(*impl_, rank());
  if (count == 0) return;
  queue_on_nccl_stream(*impl_, rank(), "ncclReduce", [&] {
    return ncclReduce(data, data, count, ncclFloat32, ncclSum, root, impl_->comm, impl_->stream);
  });
  complete_on_nccl_stream(*impl_, rank(), "ncclReduce");
}

void NcclCommunicator::do_allgather_in_place(float* data, std::size_t chunk, const char* what) {
  const Watchdog::Guard guard(watchdog(), what ? what : "ncclAllGather(float)");
  throw_if_aborted(*impl_, rank());
  if (chunk == 0) return;
  const float* mine = data + static_cast<std::size_t>(rank()) * chunk;
  queue_on_nccl_stream(*impl_, rank(), "ncclAllGather", [&] {
    return ncclAllGather(mine, data, chunk, ncclFloat32, impl_->comm, impl_->stream);
  });
  complete_on_nccl_stream(*impl_, rank(), "ncclAllGather");
}

int NcclCommunicator::device() const noexcept {
  return impl_->device;
}
void* NcclCommunicator::stream() const noexcept {
  return impl_->stream;
}

bool nccl_built() noexcept {
  return true;
}

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // Since NCCL 2.9: major * 10000 + minor * 100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code % 10000 / 100) + "." +
         std::to_string(code % 100);
}

int cuda_device_count() noexcept {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return devices;
}

#else  // !AUTOACCUM_HAVE_NCCL

struct NcclCommunicator::Impl {};

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> control)
    : control_(std::move(control)) {
  throw BackendUnavailable(
      "NCCL backend unavailable: this autoaccum was built without NCCL (configure with the CUDA "
      "toolkit and NCCL present, or -DAUTOACCUM_WITH_NCCL=ON)");
}

NcclCommunicator::~NcclCommunicator() = default;
void NcclCommunicator::abort() noexcept {}
void NcclCommunicator::set_compute_stream(void*) noexcept {}
void NcclCommunicator::do_allreduce_sum(float*, std::size_t, const char*) {}
void NcclCommunicator::do_allreduce_sum(double*, std::size_t, const char*) {}
void NcclCommunicator::do_queue_allreduce_sum(float*, std::size_t, const char*) {}
void NcclCommunicator::do_reduce_scatter_sum(float*, std::size_t, const char*) {}
void NcclCommunicator::do_reduce_sum(float*, std::size_t, int, const char*) {}
void NcclCommunicator::do_queue_reduce_sum(float*, std::size_t, int, const char*) {}
void NcclCommunicator::do_allgather_in_place(float*, std::size_t, const char*) {}
int NcclCommunicator::device() const noexcept {
  return -1;
}
void* NcclCommunicator::stream() const noexcept {
  return nullptr;
}
bool nccl_built() noexcept {
  return false;
}
std::string nccl_version() {
  return "not built";
}
int cuda_device_count() noexcept {
  return 0;
}

#endif

std::optional<std::chrono::milliseconds> nccl_wait_limit(const Watchdog& dog) {
  if (!dog.enabled()) return std::nullopt;
  return dog.timeout() + grace_period(dog.timeout()) + std::chrono::seconds(10);
}

void PollBackoff::pause() {
  const std::chrono::microseconds wait = next();
  if (wait.count() == 0)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(wait);
}

std::chrono::microseconds PollBackoff::next() noexcept {
  if (polls_ < kSpinPolls) {
    ++polls_;
    return std::chrono::microseconds(0);
  }
  pause_ = pause_.count() == 0 ? kFirstPause : std::min(pause_ * 2, kLongestPause);
  return pause_;
}

// The control plane is MPI in both builds.
void NcclCommunicator::allreduce_max(std::int64_t* values, std::size_t count) {
  control_->allreduce_max(values, count);
}
void NcclCommunicator::allreduce_sum(std::int64_t* values, std::size_t count) {
  control_->allreduce_sum(values, count);
}
void NcclCommunicator::allreduce_min(std::int64_t* values, std::size_t count) {
  control_->allreduce_min(values, count);
}
void NcclCommunicator::allreduce_sum_host(double* values, std::size_t count) {
  control_->allreduce_sum_host(values, count);
}
void NcclCommunicator::allgather(const void* send, std::size_t bytes, void* receive) {
  control_->allgather(send, bytes, receive);
}
void NcclCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  control_->broadcast(data, bytes, root);
}
void NcclCommunicator::barrier() {
  control_->barrier();
}

}  // namespace autoaccum::comm
