// --overlap's buckets: how the gradient region is cut, and that a bucket goes during the backward
// pass that completes it, once, in order, whatever the attempt's end.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "autoaccum/train/reduce/bucketed_reduce.hpp"
#include "autoaccum/train/reduce/reduce_buffer.hpp"
#include "test_comm.hpp"

namespace autoaccum::train {
namespace {

TEST(CutBuckets, EveryParameterOnceInOrderWithoutGaps) {
  const std::vector<std::int64_t> sizes{10, 3, 40, 0, 7, 7, 2, 0};
  for (std::int64_t floats : {1, 5, 12, 20, 1000}) {
    const auto buckets = cut_buckets(100, sizes, floats);
    ASSERT_FALSE(buckets.empty());
    std::int64_t offset = 100;
    std::size_t next = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const Bucket& bucket = buckets[b];
      EXPECT_EQ(bucket.offset, offset) << floats;
      EXPECT_EQ(bucket.first, next) << floats;
      EXPECT_GT(bucket.last, bucket.first) << floats;
      EXPECT_EQ(bucket.count,
                std::accumulate(sizes.begin() + static_cast<long>(bucket.first),
                                sizes.begin() + static_cast<long>(bucket.last), std::int64_t{0}));
      // Full buckets reach the size; only the last one may stay below it.
      if (b + 1 < buckets.size()) {
        EXPECT_GE(bucket.count, floats) << floats;
      }
      offset += bucket.count;
      next = bucket.last;
    }
    EXPECT_EQ(next, sizes.size()) << floats;
    EXPECT_EQ(offset, 100 + 69) << floats;
  }
  // A parameter larger than a bucket is a bucket of its own; empty ones at the end join the
  // bucket before them.
  const std::vector<std::int64_t> trailing{10, 3, 40, 0, 7, 7, 0, 0};
  const auto buckets = cut_buckets(0, trailing, 12);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].count, 13);  // 10 + 3
  EXPECT_EQ(buckets[1].count, 40);
  EXPECT_EQ(buckets[2].count, 14);  // 0 + 7 + 7 + 0 + 0
  EXPECT_EQ(buckets[2].last, trailing.size());
  EXPECT_TRUE(cut_buckets(0, {}, 4).empty());
}

// A communicator of one rank that records each data-plane call and doubles the values (as if a
// second rank had the same), so that a float sent twice or never shows. Queued (as NCCL), it
// says so and records which thread queued each sum and whether it came through the queue.
class RecordingComm final : public test::TestComm {
 public:
  explicit RecordingComm(bool queued = false) : queued_(queued) {}
  std::string_view backend() const override { return queued_ ? "nccl" : "recording"; }
  bool queues_collectives() const override { return queued_; }

  std::vector<std::string> calls() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  std::vector<std::thread::id> threads() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return threads_;
  }
  // Waits until `count` calls were made (false after 10 s).
  bool wait_for(std::size_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(10),
                             [&] { return calls_.size() >= count; });
  }

 protected:
  void do_allreduce_sum(float* data, std::size_t count, const char* what) override {
    record(data, count, what, "");
  }
  void do_queue_allreduce_sum(float* data, std::size_t count, const char* what) override {
    record(data, count, what, "queued ");
  }
  void record(float* data, std::size_t count, const char* what, const std::string& how) {
    for (std::size_t i = 0; i < count; ++i)
      data[i] *= 2;
    const std::lock_guard<std::mutex> lock(mutex_);
    calls_.push_back(how + (what ? what : "unnamed"));
    threads_.push_back(std::this_thread::get_id());
    changed_.notify_all();
  }

 private:
  bool queued_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::string> calls_;
  std::vector<std::thread::id> threads_;
};

// Runs `check` before the accumulator of `parameter` adds its gradient.
class BeforeAccumulation final : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulation(std::function<void()> check) : check_(std::move(check)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& g) override {
    check_();
    return g;
  }

 private:
  std::function<void()> check_;
};

// Parameters in registration order: one the forward pass does not use, then three layers.
struct ThreeLayers {
  std::vector<at::Tensor> parameters;  // unused, w1, w2, w3
  ThreeLayers() {
    torch::manual_seed(3);
    for (auto shape : {std::vector<std::int64_t>{5}, {16, 8}, {16, 16}, {4, 16}})
      parameters.push_back(torch::randn(shape).requires_grad_(true));
  }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = torch::relu(x.matmul(parameters[1].t()));
    h = torch::relu(h.matmul(parameters[2].t()));
    return h.matmul(parameters[3].t()).pow(2).sum();
  }
};

// A reduce buffer whose gradient region holds `bound`'s gradients, in that order, followed by
// `control` floats that no bucket may touch.
struct BoundBuffer {
  std::int64_t floats = 0;
  std::unique_ptr<ReduceBuffer> buffer;
  BoundBuffer(const std::vector<at::Tensor>& bound, std::int64_t control) {
    ReduceLayout layout;
    for (const auto& p : bound)
      floats += p.numel();
    const auto region = layout.add("gradients", floats);
    layout.add("control", control);
    buffer = std::make_unique<ReduceBuffer>(std::move(layout), c10::Device(c10::kCPU));
    buffer->bind_gradients(bound, region);
  }
};

// Each test runs with a communication thread (MPI) and with sums queued inline (NCCL).
class BucketedReduceModes : public testing::TestWithParam<bool> {
 protected:
  bool queued() const { return GetParam(); }
  std::string prefix() const {
    return queued() ? "queued ncclAllReduce(float, sum)" : "MPI_Allreduce(float, sum)";
  }
};

TEST_P(BucketedReduceModes, TheFirstBucketGoesBeforeBackwardEndsAndEveryFloatGoesOnce) {
  ThreeLayers net;
  // Bound in reverse (as the trainer binds): w3, w2, w1, unused; w3's gradient comes first in
  // backward and in the buffer; each parameter a bucket of its own.
  std::vector<at::Tensor> bound(net.parameters.rbegin(), net.parameters.rend());
  BoundBuffer bound_buffer(bound, 3);
  ReduceBuffer& buffer = *bound_buffer.buffer;
  const std::int64_t floats = bound_buffer.floats;
  RecordingComm comm(queued());
  BucketedReduce reduce(comm, buffer.all(), 0, bound, 4);
  ASSERT_EQ(reduce.buckets().size(), 4u);
  EXPECT_EQ(std::string(reduce.tail_label()),
            (queued() ? "ncclAllReduce(float, sum)" : "MPI_Allreduce(float, sum)") +
                std::string(" of the step's control values"));

  // w1's gradient is the last one backward computes: by then the buckets of w3 and w2 (the
  // first two) must have gone, without waiting for finish().
  bool in_last = false, seen_before_last = false;
  std::size_t calls_before = 0;
  auto accumulator = torch::autograd::impl::grad_accumulator(net.parameters[1]);
  accumulator->add_pre_hook(std::make_unique<BeforeAccumulation>([&] {
    if (in_last) seen_before_last = comm.wait_for(calls_before + 2);
  }));

  const at::Tensor x = torch::randn({6, 8});
  for (int attempt = 0; attempt < 2; ++attempt) {
    buffer.zero();
    reduce.begin();
    net.loss(x.narrow(0, 0, 3)).backward();  // an earlier micro-batch: accumulates locally
    calls_before = static_cast<std::size_t>(4 * attempt);
    EXPECT_EQ(comm.calls().size(), calls_before);
    const at::Tensor last = net.loss(x.narrow(0, 3, 3));  // the last micro-batch
    reduce.arm(last);
    in_last = true;
    seen_before_last = false;
    last.backward();
    in_last = false;
    EXPECT_TRUE(seen_before_last) << "attempt " << attempt;
    reduce.finish();
    const auto calls = comm.calls();
    ASSERT_EQ(calls.size(), static_cast<std::size_t>(4 * (attempt + 1)));
    for (std::size_t b = 0; b < 4; ++b) {
      EXPECT_EQ(calls[4 * static_cast<std::size_t>(attempt) + b],
                prefix() + " of gradient bucket " + std::to_string(b + 1) + " of 4");
    }
  }
  // Every gradient float was doubled exactly once; the control floats were never sent.
  std::vector<at::Tensor> expected;
  {
    std::vector<at::Tensor> fresh;
    for (const auto& p : bound)
      fresh.push_back(p.detach().clone().requires_grad_(true));
    // fresh is in bound order: w3, w2, w1, unused.
    at::Tensor h = torch::relu(x.matmul(fresh[2].t()));
    h = torch::relu(h.matmul(fresh[1].t()));
    h.matmul(fresh[0].t()).pow(2).sum().backward();  // w3 is fresh[0]
    for (std::size_t i = 0; i + 1 < fresh.size(); ++i)
      expected.push_back(fresh[i].grad().reshape(-1) * 2);
    expected.push_back(torch::zeros({5}));
  }
  // Two 3-row micro-batches against one 6-row product: they round differently (with the CUDA
  // wheel's 2.11 on an AMD EPYC, by 0.00098, one float step, in gradients up to 8220: more than
  // 1e-5 of a small element). The bound is relative to the largest gradient; a float sent twice
  // or never would be off by as much as the gradient itself.
  const at::Tensor want = torch::cat(expected);
  const double error = (buffer.all().narrow(0, 0, floats) - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LE(error, 1e-6 * scale) << "largest gradient " << scale;
  EXPECT_TRUE(torch::equal(buffer.all().narrow(0, floats, 3), torch::zeros({3})));
}

TEST_P(BucketedReduceModes, AParameterTheLossDoesNotReachDoesNotHoldBackTheBucketsAfterIt) {
  // The unused parameter bound first: its bucket is the first to go, and must not wait for a
  // gradient that never comes (then no bucket would go before backward ends).
  ThreeLayers net;
  std::vector<at::Tensor> bound{net.parameters[0], net.parameters[3], net.parameters[2],
                                net.parameters[1]};
  BoundBuffer bound_buffer(bound, 0);
  RecordingComm comm(queued());
  BucketedReduce reduce(comm, bound_buffer.buffer->all(), 0, bound, 4);
  bool in_last = false, seen_before_last = false;
  auto accumulator = torch::autograd::impl::grad_accumulator(net.parameters[1]);
  accumulator->add_pre_hook(std::make_unique<BeforeAccumulation>([&] {
    if (in_last) seen_before_last = comm.wait_for(3);  // unused, w3, w2
  }));
  reduce.begin();
  const at::Tensor loss = net.loss(torch::randn({4, 8}));
  reduce.arm(loss);
  in_last = true;
  loss.backward();
  in_last = false;
  reduce.finish();
  EXPECT_TRUE(seen_before_last);
  EXPECT_EQ(comm.calls().size(), 4u);
}

TEST_P(BucketedReduceModes, AnAttemptThatEndsEarlySendsEveryBucketInOrderAtFinish) {
  ThreeLayers net;
  std::vector<at::Tensor> bound(net.parameters.rbegin(), net.parameters.rend());
  BoundBuffer bound_buffer(bound, 0);
  RecordingComm comm(queued());
  // One bucket holds them all.
  BucketedReduce reduce(comm, bound_buffer.buffer->all(), 0, bound, 1 << 20);
  ASSERT_EQ(reduce.buckets().size(), 1u);
  // Out of memory before the last backward (never armed): nothing goes before finish().
  reduce.begin();
  const at::Tensor unused = net.loss(torch::randn({4, 8}));
  unused.backward();  // not armed: accumulates locally
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(comm.calls().empty());
  reduce.finish();
  EXPECT_EQ(comm.calls().size(), 1u);
  // Armed with a loss that reaches no parameter: every bucket may go at once, and goes once.
  reduce.begin();
  reduce.arm(torch::zeros({1}));
  reduce.finish();
  EXPECT_EQ(comm.calls().size(), 2u);
}

// Queued, no thread of its own: the buckets that went during backward were queued by the thread
// that ran backward (on a CPU, the caller's; on a GPU, autograd's device thread), the rest by
// finish()'s caller.
TEST(BucketedReduce, QueuedSumsAreMadeByTheThreadsThatCompleteTheBuckets) {
  ThreeLayers net;
  std::vector<at::Tensor> bound(net.parameters.rbegin(), net.parameters.rend());
  BoundBuffer bound_buffer(bound, 0);
  RecordingComm comm(true);
  BucketedReduce reduce(comm, bound_buffer.buffer->all(), 0, bound, 4);
  ASSERT_EQ(reduce.buckets().size(), 4u);
  reduce.begin();
  const at::Tensor loss = net.loss(torch::randn({4, 8}));
  reduce.arm(loss);
  std::thread([&] { loss.backward(); }).join();
  const auto during = comm.threads();
  // w3, w2 and w1 complete their buckets during backward; the unused parameter's bucket (the
  // last) can go only after them, so it goes from the hook of w1 as well.
  EXPECT_EQ(during.size(), 4u);
  for (const auto& id : during)
    EXPECT_NE(id, std::this_thread::get_id());
  reduce.finish();
  EXPECT_EQ(comm.calls().size(), 4u);
  // Never armed (out of memory before the last backward): nothing is queued before finish(),
  // which queues them all, here.
  reduce.begin();
  net.loss(torch::randn({4, 8})).backward();
  EXPECT_EQ(comm.threads().size(), 4u);
  reduce.finish();
  const auto all = comm.threads();
  ASSERT_EQ(all.size(), 8u);
  for (std::size_t i = 4; i < 8; ++i)
    EXPECT_EQ(all[i], std::this_thread::get_id());
}

INSTANTIATE_TEST_SUITE_P(ThreadAndQueued, BucketedReduceModes, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& mode) {
                           return mode.param ? "Queued" : "Thread";
                         });

}  // namespace
}  // namespace autoaccum::train
