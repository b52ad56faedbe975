// BucketedReduce: autograd hooks mark parameters ready; the buckets are all-reduced in their
// fixed order, by a communication thread (MPI: blocking collectives) or queued by the thread
// that completed them (NCCL: collectives on a stream of their own).
#include "autoaccum/train/reduce/bucketed_reduce.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "autoaccum/core/error.hpp"

namespace autoaccum::train {

std::vector<Bucket> cut_buckets(std::int64_t offset, const std::vector<std::int64_t>& sizes,
                                std::int64_t bucket_floats) {
  bucket_floats = std::max<std::int64_t>(bucket_floats, 1);
  std::vector<Bucket> buckets;
  Bucket current;
  current.offset = offset;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    current.count += sizes[i];
    current.last = i + 1;
    if (current.count >= bucket_floats) {
      buckets.push_back(current);
      current = Bucket{current.offset + current.count, 0, i + 1, i + 1};
    }
  }
  if (current.last > current.first) {
    // Parameters of no elements at the end join the bucket before them.
    if (current.count == 0 && !buckets.empty())
      buckets.back().last = current.last;
    else
      buckets.push_back(current);
  }
  return buckets;
}

namespace {

// How a timeout names `comm`'s float sum: an all-reduce, or a reduce to the owners.
std::string collective_name(const comm::Communicator& comm, bool to_owners) {
  const bool nccl = comm.backend() == "nccl";
  if (to_owners) return nccl ? "ncclReduce(float, sum)" : "MPI_Reduce(float, sum)";
  return nccl ? "ncclAllReduce(float, sum)" : "MPI_Allreduce(float, sum)";
}

}  // namespace

std::string control_values_label(const comm::Communicator& comm) {
  return collective_name(comm, false) + " of the step's control values";
}

struct BucketedReduce::Shared {
  comm::Communicator& comm;
  at::Tensor buffer;  // kept alive while the thread may still write into it
  float* base = nullptr;
  std::int64_t bucket_bytes = 0;
  std::int64_t region = 0, owner_slice = 0;  // sharded: rank j owns [region + j*slice, ...)
  std::vector<Bucket> buckets;
  std::vector<std::string> labels;               // the watchdog's names of the collectives
  std::string tail_label;                        // and of the step's tail, after them
  std::vector<std::size_t> bucket_of;            // parameter -> bucket
  std::unique_ptr<std::atomic<int>[]> pending;   // per bucket: parameters still to come
  std::unique_ptr<std::atomic<bool>[]> arrived;  // per parameter, in this attempt
  // The accumulators the hooks hang on: autograd holds a parameter's accumulator weakly and
  // would make a new one (without the hook) if none held it.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::atomic<bool> armed{false};
  std::atomic<std::int64_t> twice{-1};  // a parameter whose gradient arrived twice, if any
  bool queued = false;  // the communicator queues collectives: no thread, buckets go inline

  std::mutex mutex;
  std::condition_variable wake;
  std::vector<char> ready;  // per bucket: may be sent
  std::size_t next = 0;     // the bucket the thread sends next
  bool active = false, finishing = false, in_collective = false, stop = false;
  std::exception_ptr error;
  std::thread thread;

  Shared(comm::Communicator& c, at::Tensor b) : comm(c), buffer(std::move(b)) {}

  void mark_ready(std::size_t parameter) noexcept {
    if (!armed.load(std::memory_order_acquire)) return;
    if (arrived[parameter].exchange(true)) {
      twice.store(static_cast<std::int64_t>(parameter));
      return;
    }
    const std::size_t b = bucket_of[parameter];
    if (pending[b].fetch_sub(1) == 1) {
      const std::lock_guard<std::mutex> lock(mutex);
      ready[b] = 1;
      if (queued)
        queue_ready();
      else
        wake.notify_all();
    }
  }

  // Bucket `b`'s sum: an all-reduce, or a reduce to each rank owning part of it (in rank
  // order); queued on the device, or made at once.
  void send(std::size_t b, bool queue) {
    const Bucket& bucket = buckets[b];
    const char* label = labels[b].c_str();
    if (owner_slice <= 0) {
      const auto count = static_cast<std::size_t>(bucket.count);
      queue ? comm.queue_allreduce_sum(base + bucket.offset, count, label)
            : comm.allreduce_sum(base + bucket.offset, count, label);
      return;
    }
    const std::int64_t end = bucket.offset + bucket.count;
    for (std::int64_t at = bucket.offset; at < end;) {
      const auto owner = static_cast<int>((at - region) / owner_slice);
      const std::int64_t upto = std::min(end, region + (owner + 1) * owner_slice);
      const auto count = static_cast<std::size_t>(upto - at);
      queue ? comm.queue_reduce_sum(base + at, count, owner, label)
            : comm.reduce_sum(base + at, count, owner, label);
      at = upto;
    }
  }

  // Queued mode, with `mutex` held: queues every bucket that may go, in order. The calls
  // return at once (the sums run on the device after the gradients they read), so they are
  // made here, by the autograd thread that completed the bucket, or by finish().
  void queue_ready() noexcept {
    while (active && next < buckets.size() && ready[next]) {
      try {
        send(next, true);
      } catch (...) {
        error = std::current_exception();
        next = buckets.size();  // the rank fails; no further bucket is sent
        return;
      }
      ++next;
    }
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      wake.wait(lock, [&] { return stop || (active && next < buckets.size() && ready[next]); });
      if (stop) return;
      const std::size_t b = next;
      in_collective = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        send(b, false);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      in_collective = false;
      if (failed) {
        error = failed;
        next = buckets.size();  // the rank fails; no further bucket is sent
      } else {
        ++next;
      }
      wake.notify_all();
    }
  }
};

namespace {

// Runs after a parameter's gradient accumulator has added this backward pass's gradient.
class ReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<BucketedReduce::Shared> shared, std::size_t parameter)
      : shared_(std::move(shared)), parameter_(parameter) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto shared = shared_.lock()) shared->mark_ready(parameter_);
    return outputs;
  }

 private:
  std::weak_ptr<BucketedReduce::Shared> shared_;
  std::size_t parameter_;
};

}  // namespace

BucketedReduce::BucketedReduce(comm::Communicator& comm, at::Tensor buffer, std::int64_t offset,
                               const std::vector<at::Tensor>& parameters, std::int64_t bucket_bytes,
                               std::int64_t owner_slice)
    : shared_(std::make_shared<Shared>(comm, buffer)) {
  Shared& s = *shared_;
  s.region = offset;
  s.owner_slice = owner_slice;
  s.queued = comm.queues_collectives();
  // A thread's blocking collective reads host memory: a device buffer written by kernels still
  // queued when the hook runs would be read too early, so device buffers need queued sums.
  if (buffer.scalar_type() != at::kFloat || (!s.queued && buffer.device().type() != c10::kCPU))
    throw std::logic_error(
        "BucketedReduce: the buffer must be float32, on the host unless the "
        "communicator queues its collectives");
  s.base = buffer.data_ptr<float>();
  s.bucket_bytes = bucket_bytes;
  std::vector<std::int64_t> sizes;
  for (const auto& p : parameters)
    sizes.push_back(p.numel());
  s.buckets = cut_buckets(offset, sizes, std::max<std::int64_t>(bucket_bytes / 4, 1));
  s.bucket_of.resize(parameters.size());
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    for (std::size_t i = s.buckets[b].first; i < s.buckets[b].last; ++i)
      s.bucket_of[i] = b;
    s.labels.push_back(collective_name(comm, owner_slice > 0) + " of gradient bucket " +
                       std::to_string(b + 1) + " of " + std::to_string(s.buckets.size()));
  }
  s.tail_label = control_values_label(comm);
  s.pending = std::make_unique<std::atomic<int>[]>(s.buckets.size());
  s.arrived = std::make_unique<std::atomic<bool>[]>(parameters.size());
  s.ready.assign(s.buckets.size(), 0);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters[i]);
    if (!accumulator) throw std::logic_error("BucketedReduce: a parameter has no accumulator");
    accumulator->add_post_hook(std::make_unique<ReadyHook>(shared_, i));
    s.accumulators.push_back(std::move(accumulator));
  }
  if (!s.queued) s.thread = std::thread([shared = shared_] { shared->run(); });
}

BucketedReduce::~BucketedReduce() {
  Shared& s = *shared_;
  bool blocked = false;
  {
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.stop = true;
    blocked = s.in_collective;
    s.wake.notify_all();
  }
  // A thread inside a collective that the other ranks never join (this rank is failing) would
  // keep the process from ending: it is left to the job's abort, holding what it uses.
  if (!s.thread.joinable()) return;
  if (blocked)
    s.thread.detach();
  else
    s.thread.join();
}

const std::vector<Bucket>& BucketedReduce::buckets() const noexcept {
  return shared_->buckets;
}

const char* BucketedReduce::tail_label() const noexcept {
  return shared_->tail_label.c_str();
}

bool BucketedReduce::queued() const noexcept {
  return shared_->queued;
}

std::int64_t BucketedReduce::bucket_bytes() const noexcept {
  return shared_->bucket_bytes;
}

void BucketedReduce::begin() {
  Shared& s = *shared_;
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.active) throw std::logic_error("BucketedReduce: begin() before finish()");
  s.armed.store(false);
  s.twice.store(-1);
  for (std::size_t b = 0; b < s.buckets.size(); ++b) {
    s.pending[b].store(static_cast<int>(s.buckets[b].last - s.buckets[b].first));
    s.ready[b] = 0;
  }
  for (std::size_t i = 0; i < s.bucket_of.size(); ++i)
    s.arrived[i].store(false);
  s.next = 0;
  s.finishing = false;
  s.active = true;
}

std::vector<char> reached(const at::Tensor& loss,
                          const std::vector<std::shared_ptr<torch::autograd::Node>>& nodes) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<const torch::autograd::Node*> stack;
  if (const auto root = loss.grad_fn()) stack.push_back(root.get());
  while (!stack.empty()) {
    const torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  std::vector<char> out;
  for (const auto& node : nodes)
    out.push_back(seen.count(node.get()) ? 1 : 0);
  return out;
}

void BucketedReduce::arm(const at::Tensor& loss) {
  Shared& s = *shared_;
  const std::vector<char> used = reached(loss, s.accumulators);
  s.armed.store(true, std::memory_order_release);
  for (std::size_t i = 0; i < s.accumulators.size(); ++i) {
    if (!used[i]) s.mark_ready(i);
  }
}

void BucketedReduce::finish() {
  Shared& s = *shared_;
  s.armed.store(false);
  std::unique_lock<std::mutex> lock(s.mutex);
  s.finishing = true;
  std::fill(s.ready.begin(), s.ready.end(), 1);
  if (s.queued) {
    s.queue_ready();
  } else {
    s.wake.notify_all();
    s.wake.wait(lock, [&] { return s.next >= s.buckets.size(); });
  }
  s.active = false;
  if (s.error) std::rethrow_exception(s.error);
  const std::int64_t twice = s.twice.load();
  if (twice >= 0) {
    throw Error("--overlap on: the gradient of parameter " + std::to_string(twice) +
                " (in binding order) was accumulated twice in one backward pass (reentrant "
                "backward or activation checkpointing), after its bucket may have been sent; "
                "use --overlap off with this model");
  }
}

}  // namespace autoaccum::train
