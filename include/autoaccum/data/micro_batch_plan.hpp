// MicroBatchPlan: which rows of a rank's slab go through the model together, and their padded
// shape. Row data is cut into consecutive slices of m rows (views); document data into groups
// of documents, longest first, whose padded size (documents x longest) stays within a token
// budget, with the least padding that the fewest such groups allow. The step loop runs a plan
// without knowing which kind it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "autoaccum/data/batch.hpp"

namespace autoaccum::data {

struct MicroBatchPiece {
  std::int64_t first = 0;               // rows: the slab's first row in it
  std::vector<std::int64_t> documents;  // documents: the slab's documents in it, longest first
  std::int64_t count = 0;               // rows or documents in it
  std::int64_t width = 0;               // documents: the padded length (its longest); rows: 0
  std::int64_t tokens = 0;              // documents: the real tokens in it
  // The size a budget limits: padded tokens for documents, rows for rows.
  std::int64_t size() const noexcept { return width > 0 ? count * width : count; }
};

struct MicroBatchPlan {
  std::vector<MicroBatchPiece> pieces;
  std::int64_t tokens = 0;         // documents: real tokens over every piece
  std::int64_t padded_tokens = 0;  // documents: what the model processes (rows x width summed)
};

// How a token budget is spent across widths. A piece of c documents at width w costs
// c x w x (1 + ratio x w) and fits while that is at most budget x (1 + ratio x reference): the
// cost of the budget at the reference width, the longest document, where the budget was
// predicted to fit. `ratio` is a memory model's bytes per row x width^2 over its bytes per padded
// token (attention's scores make a wide token dearer than a narrow one), so a piece of short
// documents takes more tokens than the budget and never more memory than the budget at the
// reference width. 0 (the default): every padded token costs the same.
struct WidthCost {
  double ratio = 0;
  std::int64_t reference = 0;
};

// What a micro-batch of documents is predicted to take, in padded tokens' worth of time: `fixed`
// per micro-batch (kernel launches, the per-call work of the model and the loss), plus each
// padded token weighed 1 + `width` x its piece's width (attention's scores: a token of a wide
// piece costs more). A plan with a PieceCost minimises the sum over its pieces; without one it
// takes the fewest pieces and then the least padding, which is the limit of a fixed part that
// dominates.
struct PieceCost {
  double fixed = 0;
  double width = 0;
  double of(std::int64_t count, std::int64_t piece_width) const {
    const auto w = static_cast<double>(piece_width);
    return fixed + static_cast<double>(count) * w * (1 + width * w);
  }
};

// Row data: ceil(rows / size) consecutive slices of `size` rows (the last may be shorter).
MicroBatchPlan plan_rows(std::int64_t rows, std::int64_t size);

// Documents of these lengths under a budget of `budget` padded tokens: ordered longest first
// (ties in slab order) and cut into runs of that order, each holding (count x its first,
// longest document) <= budget (weighed by `cost`) or a single document (one longer than the
// budget goes alone). Without `time`, the cut has the fewest pieces (as many as taking documents
// while they fit would give) and, among those, the fewest padded tokens; with it, the least
// predicted time (time->of summed over the pieces), found by the same exact shortest path. Ties
// keep the earlier pieces full. Beyond 2^24 candidate runs (very many short documents under a
// large budget) the plan is the greedy cut (each piece as full as it fits).
MicroBatchPlan plan_documents(const std::vector<std::int64_t>& lengths, std::int64_t budget,
                              WidthCost cost = {}, std::optional<PieceCost> time = {});

// The piece a memory probe measures at a narrow width, so that a memory model can tell a wide
// token's cost from a narrow one's (WidthCost): of the pieces holding at least half the budget's
// padded tokens, the narrowest, if its width is at most 3/4 of the first (widest) piece's; none
// when the documents are too alike in length to tell (or the plan is rows, or empty).
std::optional<std::size_t> narrow_piece(const MicroBatchPlan& plan, std::int64_t budget);

// A probe's piece of documents measured at `width` (the data's longest document) instead of its
// own: padded that wide, holding as many of its documents as `budget` padded tokens allow (at
// least one). Attention's scores grow with the width, so a budget measured at the widest width
// is one that fits at every narrower one; a probe measured at the first batch's narrower
// documents predicts too much for a batch that holds the longest. Rows, or a piece as wide
// already: unchanged.
void widen_piece(const Batch& slab, MicroBatchPiece& piece, std::int64_t width,
                 std::int64_t budget);

// One document alone, the slab's nearest in length to `length` (the first such): what a probe
// times to learn a micro-batch's fixed cost (a short piece is mostly that). Documents only.
MicroBatchPiece short_piece(const Batch& slab, std::int64_t length);

// The plan for a slab read by SlabReader: rows, or its documents' lengths; `size` is rows or a
// token budget (`cost`: documents only).
MicroBatchPlan plan_micro_batches(const Batch& slab, std::int64_t size, WidthCost cost = {},
                                  std::optional<PieceCost> time = {});

// The fields of one piece, in the slab's order (inputs, then the target). Rows: views of the
// slab. Documents: token ids int64 [m, width] padded on the right with 0, then (--inputs
// tokens,lengths) the lengths int64 [m], then the target: [m, width] next tokens or labels
// padded with the ignore index (a document's last position has no next token), or [m] labels.
Batch micro_batch(const Batch& slab, const MicroBatchPiece& piece);

// The padded size of `lengths` as one micro-batch: count x longest (at least 1 wide).
std::int64_t padded_size(const std::vector<std::int64_t>& lengths);

// A batch of `count` documents of these lengths split between `world` ranks into contiguous
// ranges of near-equal tokens: offsets [world + 1] into the batch, each rank at least one
// document (count >= world). Rank r's range ends where the running total comes nearest to
// r+1 / world of the batch's tokens (integer arithmetic: the same cut on every platform).
// `weights` (one per rank, e.g. --balance throughput's shares): rank r's range ends nearest to
// (w0 + ... + wr) / sum(w) of the tokens instead; empty: equal weights.
std::vector<std::int64_t> token_balanced_offsets(const std::int64_t* lengths, std::int64_t count,
                                                 int world,
                                                 const std::vector<std::int64_t>& weights = {});

}  // namespace autoaccum::data
