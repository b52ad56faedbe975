// BatchPlan: which global rows form batch s of epoch e, and which contiguous part is rank r's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace autoaccum::data {

enum class Shuffle { kNone, kBatch };
Shuffle parse_shuffle(const std::string& text);  // "none" | "batch"; else UsageError

struct RowRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const noexcept { return end - begin; }
  bool operator==(const RowRange& o) const noexcept { return begin == o.begin && end == o.end; }
};

// With Shuffle::kNone batch s of an epoch is rows [s*B, (s+1)*B); with kBatch the order of the
// whole batches is a permutation drawn from (seed, epoch). An incomplete last batch is dropped.
// Rank r of W takes rows [floor(r*B/W), floor((r+1)*B/W)) of its batch: one slab per rank,
// sizes differing by at most one, so B need not divide by W.
class BatchPlan {
 public:
  // Throws UsageError when B < 1, B > rows (naming --global-batch) or W > B.
  BatchPlan(std::int64_t rows, std::int64_t global_batch, int world_size, Shuffle shuffle,
            std::uint64_t seed);
  // Document batches cut by tokens (--global-batch-tokens): batch k of the file takes whole
  // documents in order while its tokens stay within `tokens`; the data's last batch is dropped
  // when it ends short of that because the data ended. UsageError when a document is longer
  // than `tokens` or a batch has fewer documents than ranks.
  static BatchPlan by_tokens(const std::vector<std::int64_t>& lengths, std::int64_t tokens,
                             int world_size, Shuffle shuffle, std::uint64_t seed);

  std::int64_t rows() const noexcept { return rows_; }
  // Rows per batch; for batches cut by tokens, the largest batch's documents.
  std::int64_t global_batch() const noexcept { return global_batch_; }
  bool by_tokens() const noexcept { return !boundaries_.empty(); }
  // Batch `index` of the file, in file order.
  RowRange file_batch(std::int64_t index) const;
  int world_size() const noexcept { return world_size_; }
  std::int64_t batches_per_epoch() const noexcept { return batches_per_epoch_; }

  // Which batch of the file (0-based, in file order) is step `step` of `epoch`.
  std::int64_t batch_index(std::int64_t epoch, std::int64_t step) const;
  RowRange batch_rows(std::int64_t epoch, std::int64_t step) const;
  RowRange rank_rows(std::int64_t epoch, std::int64_t step, int rank) const;

  // Rank r's part of a batch of B rows, as offsets into the batch.
  static RowRange rank_part(std::int64_t global_batch, int world_size, int rank);
  // The largest rank part: ceil(B / W).
  std::int64_t max_rank_rows() const noexcept;

 private:
  const std::vector<std::int64_t>& order(std::int64_t epoch) const;

  std::int64_t rows_;
  std::int64_t global_batch_;
  int world_size_;
  Shuffle shuffle_;
  std::uint64_t seed_;
  std::int64_t batches_per_epoch_;
  std::vector<std::int64_t> boundaries_;  // by tokens: batch k is [b[k], b[k + 1])
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> cached_order_;
};

// A permutation of [0, n) from `seed`, the same on every platform and compiler
// (SplitMix64 and Fisher-Yates, not the standard library's unspecified distributions).
std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed);

}  // namespace autoaccum::data
