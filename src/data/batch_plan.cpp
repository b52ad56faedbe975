// BatchPlan: pure arithmetic, the same on every rank.
#include "autoaccum/data/batch_plan.hpp"

#include <algorithm>
#include <numeric>

#include "autoaccum/core/error.hpp"
#include "autoaccum/core/splitmix.hpp"

namespace autoaccum::data {
namespace {

// Uniform in [0, bound) without modulo bias (rejection).
std::uint64_t below(std::uint64_t bound, std::uint64_t& state) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  std::uint64_t x = 0;
  do
    x = splitmix64(state);
  while (x >= limit);
  return x % bound;
}

}  // namespace

Shuffle parse_shuffle(const std::string& text) {
  if (text == "none") return Shuffle::kNone;
  if (text == "batch") return Shuffle::kBatch;
  throw UsageError("--shuffle: '" + text + "' is not one of batch, none");
}

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::uint64_t state = seed;
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(below(static_cast<std::uint64_t>(i) + 1, state));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

BatchPlan::BatchPlan(std::int64_t rows, std::int64_t global_batch, int world_size, Shuffle shuffle,
                     std::uint64_t seed)
    : rows_(rows),
      global_batch_(global_batch),
      world_size_(world_size),
      shuffle_(shuffle),
      seed_(seed) {
  if (global_batch < 1) {
    throw UsageError("--global-batch must be at least 1 (got " + std::to_string(global_batch) +
                     ")");
  }
  if (rows < 1) throw InputError("the training data has no rows");
  if (global_batch > rows) {
    throw UsageError("--global-batch " + std::to_string(global_batch) +
                     " is larger than the training data (" + std::to_string(rows) + " rows)");
  }
  if (world_size < 1 || world_size > global_batch) {
    throw UsageError("--global-batch " + std::to_string(global_batch) + " gives " +
                     std::to_string(world_size) +
                     " ranks less than one row each: use at least as many rows as ranks");
  }
  batches_per_epoch_ = rows / global_batch;
}

BatchPlan BatchPlan::by_tokens(const std::vector<std::int64_t>& lengths, std::int64_t tokens,
                               int world_size, Shuffle shuffle, std::uint64_t seed) {
  if (tokens < 1) throw UsageError("--global-batch-tokens must be at least 1");
  std::vector<std::int64_t> boundaries{0};
  std::int64_t in_batch = 0, largest = 0;
  const auto count = static_cast<std::int64_t>(lengths.size());
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t n = lengths[static_cast<std::size_t>(i)];
    if (n > tokens) {
      throw UsageError("--global-batch-tokens " + std::to_string(tokens) +
                       " is smaller than document " + std::to_string(i) + " (" + std::to_string(n) +
                       " tokens); raise it, or split long documents");
    }
    if (in_batch + n > tokens) {
      boundaries.push_back(i);
      in_batch = 0;
    }
    in_batch += n;
  }
  // The last batch ended because the data did: whole only when no further document would fit.
  if (in_batch > 0 && count > boundaries.back()) boundaries.push_back(count);
  if (boundaries.size() > 2 && in_batch > 0) {
    const std::int64_t smallest = *std::min_element(lengths.begin(), lengths.end());
    if (in_batch + smallest <= tokens) boundaries.pop_back();
  }
  if (boundaries.size() < 2) throw InputError("the training data has no documents");
  for (std::size_t k = 0; k + 1 < boundaries.size(); ++k) {
    const std::int64_t documents = boundaries[k + 1] - boundaries[k];
    largest = std::max(largest, documents);
    if (documents < world_size) {
      throw UsageError("--global-batch-tokens " + std::to_string(tokens) + " gives batch " +
                       std::to_string(k) + " only " + std::to_string(documents) +
                       " document(s) for " + std::to_string(world_size) +
                       " ranks: raise it so that every rank gets a document");
    }
  }
  BatchPlan plan(boundaries.back(), largest, world_size, shuffle, seed);
  plan.rows_ = count;
  plan.batches_per_epoch_ = static_cast<std::int64_t>(boundaries.size()) - 1;
  plan.boundaries_ = std::move(boundaries);
  return plan;
}

RowRange BatchPlan::file_batch(std::int64_t index) const {
  if (!boundaries_.empty()) {
    return {boundaries_[static_cast<std::size_t>(index)],
            boundaries_[static_cast<std::size_t>(index) + 1]};
  }
  return {index * global_batch_, (index + 1) * global_batch_};
}

const std::vector<std::int64_t>& BatchPlan::order(std::int64_t epoch) const {
  if (cached_epoch_ != epoch) {
    // Each epoch's permutation depends only on (seed, epoch), so a resumed run matches.
    std::uint64_t state = seed_ ^ (0xA0761D6478BD642FULL * static_cast<std::uint64_t>(epoch + 1));
    cached_order_ = permutation(batches_per_epoch_, splitmix64(state));
    cached_epoch_ = epoch;
  }
  return cached_order_;
}

std::int64_t BatchPlan::batch_index(std::int64_t epoch, std::int64_t step) const {
  if (epoch < 0 || step < 0 || step >= batches_per_epoch_) {
    throw Error("BatchPlan: step " + std::to_string(step) + " of epoch " + std::to_string(epoch) +
                " is outside an epoch of " + std::to_string(batches_per_epoch_) + " batches");
  }
  if (shuffle_ == Shuffle::kNone) return step;
  return order(epoch)[static_cast<std::size_t>(step)];
}

RowRange BatchPlan::batch_rows(std::int64_t epoch, std::int64_t step) const {
  return file_batch(batch_index(epoch, step));
}

RowRange BatchPlan::rank_part(std::int64_t global_batch, int world_size, int rank) {
  return {global_batch * rank / world_size, global_batch * (rank + 1) / world_size};
}

RowRange BatchPlan::rank_rows(std::int64_t epoch, std::int64_t step, int rank) const {
  const RowRange batch = batch_rows(epoch, step);
  const RowRange part = rank_part(global_batch_, world_size_, rank);
  return {batch.begin + part.begin, batch.begin + part.end};
}

std::int64_t BatchPlan::max_rank_rows() const noexcept {
  return (global_batch_ + world_size_ - 1) / world_size_;
}

}  // namespace autoaccum::data
