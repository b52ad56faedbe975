// MemoryModel: a rank's peak memory as a function of its micro-batch, fitted from what it
// measured, to predict the largest micro-batch that fits (docs/design.md, "Predicting what fits").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace autoaccum::train {

// The shape of one micro-batch as the memory model sees it. Rows: `units` rows, `square` 0.
// Documents: `units` padded tokens (rows x width) and `square` rows x width^2, what attention's
// score matrices grow with.
struct MicroBatchShape {
  double units = 0;
  double square = 0;
};

// peak = fixed + per_unit x units + per_square x square, with every coefficient non-negative.
struct MemoryFit {
  double fixed = 0;       // bytes the rank holds whatever the micro-batch (state, workspaces)
  double per_unit = 0;    // bytes per row, or per padded token
  double per_square = 0;  // documents: bytes per row x width^2
  double predict(const MicroBatchShape& shape) const noexcept {
    return fixed + per_unit * shape.units + per_square * shape.square;
  }
};

// Pure and deterministic: every rank keeps one per rank, fed the same agreed measurements, and so
// every rank computes every rank's prediction alike (no collective of its own).
//
// The slopes are least-squares fits over the micro-batches measured so far; the intercept is then
// raised until no measured peak lies above the line, so a prediction never promises less memory
// than a size already measured took. A size that ran out of memory bounds every prediction from
// above.
class MemoryModel {
 public:
  // A micro-batch of `shape` completed with `peak_bytes` at its highest.
  void observe(const MicroBatchShape& shape, std::int64_t peak_bytes);
  // A micro-batch of `shape` ran out of memory.
  void ran_out(const MicroBatchShape& shape);
  // The bytes the rank held before its micro-batches (parameters, gradients, optimizer state):
  // with a single size measured, the fit is the line from it through that measurement (its
  // slope then also carries any fixed cost of an attempt: an overestimate, so a safe one).
  void set_base(std::int64_t bytes) noexcept { base_ = static_cast<double>(bytes); }

  // The fit, once two different shapes were measured (or one, with a base) and memory grows with
  // them; otherwise nothing (too little seen, or measurements that do not grow).
  std::optional<MemoryFit> fit() const;
  // The largest size in units, at most `cap`, whose predicted peak leaves `margin` (a fraction)
  // of the room above the fixed bytes unused under `limit_bytes` (0: no limit), and stays below
  // the smallest size that ran out. `width`: documents, the longest width a micro-batch may have
  // (a budget of u tokens at width w has square u x w); rows: 0. Nothing when no fit exists; 0
  // when the fixed bytes alone reach the limit.
  std::optional<std::int64_t> largest(std::int64_t limit_bytes, double margin, std::int64_t cap,
                                      double width = 0) const;
  // The smallest size that ran out of memory (units), 0 when none did.
  double failed_units() const noexcept { return failed_units_; }
  std::size_t observations() const noexcept { return points_.size(); }  // distinct shapes
  // The model as numbers, for a checkpoint: every point as (units, square, peak) in the order
  // they were kept, the smallest size that ran out, the base bytes. from_record(record()) is the
  // same model: it fits and predicts alike, bit for bit.
  struct Record {
    std::vector<double> points;  // 3 per point
    double failed_units = 0;
    double base = 0;
  };
  Record record() const;
  static MemoryModel from_record(const Record& record);
  // "fixed 7.7 MiB + 71.0 KiB/row" (+ " + 12 B/row x width^2" for documents).
  static std::string describe(const MemoryFit& fit, const std::string& unit);

 private:
  struct Point {
    MicroBatchShape shape;
    double peak = 0;
  };
  static constexpr std::size_t kMaxPoints = 256;
  std::vector<Point> points_;  // one per shape, the latest kMaxPoints
  double failed_units_ = 0;
  double base_ = 0;  // 0: unknown
};

}  // namespace autoaccum::train
