// MicroBatchPlan: row slices and length-ordered, budgeted groups of documents.
#include "autoaccum/data/micro_batch_plan.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autoaccum/core/error.hpp"

namespace autoaccum::data {

MicroBatchPlan plan_rows(std::int64_t rows, std::int64_t size) {
  if (size < 1) throw Error("plan_rows: micro-batch " + std::to_string(size));
  MicroBatchPlan plan;
  for (std::int64_t first = 0; first < rows; first += size) {
    MicroBatchPiece piece;
    piece.first = first;
    piece.count = std::min(size, rows - first);
    plan.pieces.push_back(std::move(piece));
  }
  return plan;
}

namespace {

// Whether `count` documents at width `width` fit a budget: exact integers without a width cost;
// with one, the memory the budget takes at the reference width (WidthCost).
struct BudgetFit {
  std::int64_t budget = 1;
  double ratio = 0;
  std::int64_t reference = 0;
  bool operator()(std::int64_t count, std::int64_t width) const {
    if (ratio == 0) return count * width <= budget;
    const auto w = static_cast<double>(width);
    const double at = static_cast<double>(std::max(reference, width));
    return static_cast<double>(count) * w * (1 + ratio * w) <=
           static_cast<double>(budget) * (1 + ratio * at);
  }
};

// The documents longest first (stable): `order[k]` is the k-th longest's index, `sorted[k]` its
// length (at least 1: an empty document still takes a slot).
struct LengthOrder {
  std::vector<std::int64_t> order, sorted;
};
LengthOrder length_order(const std::vector<std::int64_t>& lengths) {
  LengthOrder by;
  by.order.resize(lengths.size());
  std::iota(by.order.begin(), by.order.end(), std::int64_t{0});
  std::stable_sort(by.order.begin(), by.order.end(), [&](std::int64_t a, std::int64_t b) {
    return lengths[static_cast<std::size_t>(a)] > lengths[static_cast<std::size_t>(b)];
  });
  for (const std::int64_t k : by.order)
    by.sorted.push_back(std::max<std::int64_t>(1, lengths[static_cast<std::size_t>(k)]));
  return by;
}

// Where each piece starts. The pieces are runs [j, i) of the length order, of width sorted[j]. A
// run of one always fits (a document longer than the budget goes alone); a longer run fits by
// `fits`, which fails for every earlier j once it fails (more documents, no narrower). The cut:
// the fewest pieces, and among those the least padding, found exactly by a shortest path over the
// cut points (best[i]: the fewest pieces and then the fewest padded tokens that hold the first i
// documents); with a PieceCost the path's length is its predicted time instead. Ties keep the
// earlier pieces full (the greedy cut's shape). When the runs to weigh are too many (hundreds of
// thousands of short documents under a large budget), the greedy cut (each piece as full as it
// fits, also the fewest pieces) is used instead.
std::vector<std::size_t> cut_starts(const std::vector<std::int64_t>& sorted, const BudgetFit& fits,
                                    std::optional<PieceCost> time) {
  const std::size_t n = sorted.size();
  const auto fits_run = [&](std::size_t j, std::size_t i) {
    return i - j == 1 || fits(static_cast<std::int64_t>(i - j), sorted[j]);
  };
  struct Best {
    std::int64_t pieces, padded;
    double time;  // with a PieceCost (pieces and padding unused then)
    std::size_t from;
  };
  constexpr auto kNone = std::numeric_limits<std::int64_t>::max();
  constexpr std::size_t kMostRuns = std::size_t{1} << 24;
  std::vector<Best> best(n + 1, Best{kNone, kNone, std::numeric_limits<double>::infinity(), 0});
  best[0] = Best{0, 0, 0.0, 0};
  std::size_t runs = 0;
  for (std::size_t i = 1; i <= n && runs <= kMostRuns; ++i) {
    for (std::size_t j = i; j-- > 0 && fits_run(j, i); ++runs) {
      const Best& before = best[j];
      const std::int64_t count = static_cast<std::int64_t>(i - j);
      const std::int64_t pieces = before.pieces + 1;
      const std::int64_t padded = before.padded + count * sorted[j];
      Best& here = best[i];
      // j falls: on a tie the first candidate (the latest start, the smallest last piece) stays.
      if (time) {
        const double t = before.time + time->of(count, sorted[j]);
        if (t < here.time) here = Best{pieces, padded, t, j};
      } else if (pieces < here.pieces || (pieces == here.pieces && padded < here.padded)) {
        here = Best{pieces, padded, 0.0, j};
      }
    }
  }
  std::vector<std::size_t> starts;
  if (runs <= kMostRuns) {
    for (std::size_t i = n; i > 0; i = best[i].from)
      starts.push_back(best[i].from);
    std::reverse(starts.begin(), starts.end());
    return starts;
  }
  for (std::size_t i = 0; i < n;) {
    starts.push_back(i);
    std::size_t end = i + 1;
    while (end < n && fits_run(i, end + 1))
      ++end;
    i = end;
  }
  return starts;
}

}  // namespace

MicroBatchPlan plan_documents(const std::vector<std::int64_t>& lengths, std::int64_t budget,
                              WidthCost cost, std::optional<PieceCost> time) {
  if (budget < 1) throw Error("plan_documents: budget " + std::to_string(budget));
  const double ratio = cost.ratio > 0 && std::isfinite(cost.ratio) ? cost.ratio : 0.0;
  const LengthOrder by = length_order(lengths);
  const std::vector<std::size_t> starts =
      cut_starts(by.sorted, BudgetFit{budget, ratio, cost.reference}, time);
  MicroBatchPlan plan;
  for (std::size_t p = 0; p < starts.size(); ++p) {
    const std::size_t end = p + 1 < starts.size() ? starts[p + 1] : by.order.size();
    MicroBatchPiece piece;
    piece.width = by.sorted[starts[p]];
    for (std::size_t k = starts[p]; k < end; ++k) {
      piece.documents.push_back(by.order[k]);
      piece.tokens += lengths[static_cast<std::size_t>(by.order[k])];
      ++piece.count;
    }
    plan.tokens += piece.tokens;
    plan.padded_tokens += piece.size();
    plan.pieces.push_back(std::move(piece));
  }
  return plan;
}

std::optional<std::size_t> narrow_piece(const MicroBatchPlan& plan, std::int64_t budget) {
  if (plan.pieces.empty() || plan.pieces.front().width <= 0) return std::nullopt;  // rows
  const std::int64_t widest = plan.pieces.front().width;
  std::optional<std::size_t> narrowest;
  for (std::size_t p = 0; p < plan.pieces.size(); ++p) {
    const MicroBatchPiece& piece = plan.pieces[p];
    if (2 * piece.size() < budget || 4 * piece.width > 3 * widest) continue;
    if (!narrowest || piece.width < plan.pieces[*narrowest].width) narrowest = p;
  }
  return narrowest;
}

MicroBatchPlan plan_micro_batches(const Batch& slab, std::int64_t size, WidthCost cost,
                                  std::optional<PieceCost> time) {
  const Documents* documents = slab.documents();
  if (!documents) return plan_rows(slab.rows(), size);
  std::vector<std::int64_t> lengths;
  for (std::int64_t i = 0; i < documents->count(); ++i)
    lengths.push_back(documents->length(i));
  return plan_documents(lengths, size, cost, time);
}

std::int64_t padded_size(const std::vector<std::int64_t>& lengths) {
  if (lengths.empty()) return 0;
  return static_cast<std::int64_t>(lengths.size()) *
         std::max<std::int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
}

std::vector<std::int64_t> token_balanced_offsets(const std::int64_t* lengths, std::int64_t count,
                                                 int world,
                                                 const std::vector<std::int64_t>& weights) {
  if (world < 1 || count < world)
    throw Error("token_balanced_offsets: " + std::to_string(count) + " documents for " +
                std::to_string(world) + " ranks");
  if (!weights.empty() && static_cast<int>(weights.size()) != world)
    throw Error("token_balanced_offsets: one weight per rank");
  std::vector<std::int64_t> prefix(static_cast<std::size_t>(count) + 1, 0);
  for (std::int64_t i = 0; i < count; ++i)
    prefix[static_cast<std::size_t>(i) + 1] = prefix[static_cast<std::size_t>(i)] + lengths[i];
  const std::int64_t total = prefix.back();
  const auto weight = [&](std::int64_t r) {
    return weights.empty() ? std::int64_t{1} : weights[static_cast<std::size_t>(r)];
  };
  std::int64_t sum = 0;
  for (std::int64_t r = 0; r < world; ++r)
    sum += weight(r);
  if (sum < 1) throw Error("token_balanced_offsets: the weights sum to " + std::to_string(sum));
  const auto w = static_cast<std::int64_t>(world);
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(world) + 1, 0);
  offsets.back() = count;
  std::int64_t before = 0;  // the weights of ranks 0..r-1
  for (std::int64_t r = 1; r < w; ++r) {
    before += weight(r - 1);
    // The first boundary whose running total reaches before / sum of the tokens, or the one
    // before it when that comes nearer (compared as prefix x sum against total x before).
    const std::int64_t goal = total * before;
    std::int64_t i = std::lower_bound(prefix.begin(), prefix.end(), goal,
                                      [&](std::int64_t p, std::int64_t g) { return p * sum < g; }) -
                     prefix.begin();
    if (i > count) i = count;
    if (i > 0 && goal - prefix[static_cast<std::size_t>(i) - 1] * sum <=
                     prefix[static_cast<std::size_t>(i)] * sum - goal)
      --i;
    const std::int64_t low = offsets[static_cast<std::size_t>(r) - 1] + 1;
    const std::int64_t high = count - (w - r);
    offsets[static_cast<std::size_t>(r)] = std::clamp(i, low, high);
  }
  return offsets;
}

MicroBatchPiece short_piece(const Batch& slab, std::int64_t length) {
  const Documents* documents = slab.documents();
  if (!documents || documents->count() == 0) throw Error("short_piece: no documents");
  std::int64_t chosen = 0;
  for (std::int64_t d = 1; d < documents->count(); ++d) {
    if (std::llabs(documents->length(d) - length) < std::llabs(documents->length(chosen) - length))
      chosen = d;
  }
  MicroBatchPiece piece;
  piece.documents = {chosen};
  piece.count = 1;
  piece.width = std::max<std::int64_t>(1, documents->length(chosen));
  piece.tokens = documents->length(chosen);
  return piece;
}

void widen_piece(const Batch& slab, MicroBatchPiece& piece, std::int64_t width,
                 std::int64_t budget) {
  const Documents* documents = slab.documents();
  if (!documents || piece.width <= 0 || piece.width >= width) return;
  const std::int64_t count = std::clamp<std::int64_t>(budget / width, 1, piece.count);
  piece.documents.resize(static_cast<std::size_t>(count));
  piece.count = count;
  piece.width = width;
  piece.tokens = 0;
  for (const std::int64_t d : piece.documents)
    piece.tokens += documents->length(d);
}

Batch micro_batch(const Batch& slab, const MicroBatchPiece& piece) {
  const Documents* documents = slab.documents();
  if (!documents) return slab.slice(piece.first, piece.count);
  const std::int64_t m = piece.count;
  const std::int64_t width = piece.width;
  const auto longs = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids = at::zeros({m, width}, longs);
  at::Tensor lengths = at::empty({m}, longs);
  const bool per_document = documents->target == Documents::Target::kPerDocument;
  at::Tensor target =
      per_document ? at::empty({m}, longs) : at::full({m, width}, documents->ignore_index, longs);
  const std::int64_t* tokens = documents->tokens.data_ptr<std::int64_t>();
  const std::int64_t* labels =
      documents->labels.defined() ? documents->labels.data_ptr<std::int64_t>() : nullptr;
  std::int64_t* out_ids = ids.data_ptr<std::int64_t>();
  std::int64_t* out_lengths = lengths.data_ptr<std::int64_t>();
  std::int64_t* out_target = target.data_ptr<std::int64_t>();
  for (std::int64_t j = 0; j < m; ++j) {
    const std::int64_t d = piece.documents[static_cast<std::size_t>(j)];
    const std::int64_t start = documents->offsets[static_cast<std::size_t>(d)];
    const std::int64_t n = documents->length(d);
    out_lengths[j] = n;
    std::copy(tokens + start, tokens + start + n, out_ids + j * width);
    switch (documents->target) {
      case Documents::Target::kNextToken:
        if (n > 1) std::copy(tokens + start + 1, tokens + start + n, out_target + j * width);
        break;
      case Documents::Target::kPerToken:
        std::copy(labels + start, labels + start + n, out_target + j * width);
        break;
      case Documents::Target::kPerDocument:
        out_target[j] = labels[d];
        break;
    }
  }
  Batch batch;
  batch.add("tokens", ids);
  if (documents->lengths_input) batch.add("lengths", lengths);
  batch.add(documents->target_name, target);
  return batch;
}

}  // namespace autoaccum::data
