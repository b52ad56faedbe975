// MemoryModel: least-squares slopes, an intercept above every measurement, bounded by failures.
#include "autoaccum/train/sizing/memory_model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "autoaccum/memory/memory.hpp"

namespace autoaccum::train {

void MemoryModel::observe(const MicroBatchShape& shape, std::int64_t peak_bytes) {
  if (!(shape.units > 0) || peak_bytes <= 0) return;
  // Rows: a size at or above one that ran out now completed, so that out-of-memory was
  // transient (a regrow that succeeded) and no longer bounds the predictions. (Documents: a
  // larger budget at another width says nothing of the shape that ran out.)
  if (failed_units_ > 0 && shape.square == 0 && shape.units >= failed_units_) failed_units_ = 0;
  const double peak = static_cast<double>(peak_bytes);
  // One point per shape, at the highest peak it took: a run of a million steps at a few sizes
  // keeps a few points (every rank holds every rank's model).
  for (Point& p : points_) {
    if (p.shape.units == shape.units && p.shape.square == shape.square) {
      p.peak = std::max(p.peak, peak);
      return;
    }
  }
  // Documents give a new shape on almost every micro-batch: keep the latest kMaxPoints.
  if (points_.size() >= kMaxPoints) points_.erase(points_.begin());
  points_.push_back(Point{shape, peak});
}

MemoryModel::Record MemoryModel::record() const {
  Record r;
  for (const Point& p : points_)
    r.points.insert(r.points.end(), {p.shape.units, p.shape.square, p.peak});
  r.failed_units = failed_units_;
  r.base = base_;
  return r;
}

MemoryModel MemoryModel::from_record(const Record& record) {
  MemoryModel model;
  for (std::size_t i = 0; i + 3 <= record.points.size() && model.points_.size() < kMaxPoints;
       i += 3)
    model.points_.push_back(
        Point{MicroBatchShape{record.points[i], record.points[i + 1]}, record.points[i + 2]});
  model.failed_units_ = record.failed_units;
  model.base_ = record.base;
  return model;
}

void MemoryModel::ran_out(const MicroBatchShape& shape) {
  if (!(shape.units > 0)) return;
  failed_units_ = failed_units_ > 0 ? std::min(failed_units_, shape.units) : shape.units;
}

std::optional<MemoryFit> MemoryModel::fit() const {
  if (points_.empty()) return std::nullopt;
  const bool one_size = std::all_of(points_.begin(), points_.end(), [&](const Point& p) {
    return p.shape.units == points_.front().shape.units;
  });
  if (one_size) {
    // The line from the base through the highest measurement at that size.
    if (!(base_ > 0)) return std::nullopt;
    double peak = 0;
    for (const Point& p : points_)
      peak = std::max(peak, p.peak);
    const double units = points_.front().shape.units;
    if (!(peak > base_)) return std::nullopt;
    MemoryFit fit;
    fit.fixed = base_;
    fit.per_unit = (peak - base_) / units;
    return fit;
  }
  const double n = static_cast<double>(points_.size());
  double mu = 0, mq = 0, mp = 0;
  for (const Point& p : points_) {
    mu += p.shape.units;
    mq += p.shape.square;
    mp += p.peak;
  }
  mu /= n;
  mq /= n;
  mp /= n;
  double suu = 0, sqq = 0, suq = 0, sup = 0, sqp = 0;
  for (const Point& p : points_) {
    const double du = p.shape.units - mu, dq = p.shape.square - mq, dp = p.peak - mp;
    suu += du * du;
    sqq += dq * dq;
    suq += du * dq;
    sup += du * dp;
    sqp += dq * dp;
  }
  // Two distinct sizes at least: otherwise there is no slope to extrapolate with.
  if (!(suu > 0)) return std::nullopt;
  MemoryFit fit;
  const double det = suu * sqq - suq * suq;
  bool both = false;
  if (sqq > 0 && det > 1e-9 * suu * sqq) {
    // Tokens and width^2 varied independently: both slopes, kept only when neither is negative.
    const double a = (sup * sqq - sqp * suq) / det;
    const double b = (sqp * suu - sup * suq) / det;
    if (a >= 0 && b >= 0) {
      fit.per_unit = a;
      fit.per_square = b;
      both = true;
    } else if (sqp > 0 && sqp * sqp / sqq > std::max(sup, 0.0) * sup / suu) {
      // One slope, the one that explains more: here width^2 alone. (Tokens alone would give a
      // narrow and a wide token one cost, wrong at the widest width, where budgets are set.)
      fit.per_square = sqp / sqq;
      both = true;
    }
  }
  if (!both) fit.per_unit = sup / suu;
  // Memory that does not grow with the micro-batch gives nothing to predict with.
  if (!(fit.per_unit > 0) && !(fit.per_square > 0)) return std::nullopt;
  fit.per_unit = std::max(fit.per_unit, 0.0);
  double fixed = -HUGE_VAL;
  for (const Point& p : points_)
    fixed =
        std::max(fixed, p.peak - fit.per_unit * p.shape.units - fit.per_square * p.shape.square);
  fit.fixed = std::max(fixed, 0.0);
  return fit;
}

std::optional<std::int64_t> MemoryModel::largest(std::int64_t limit_bytes, double margin,
                                                 std::int64_t cap, double width) const {
  const auto f = fit();
  if (!f) return std::nullopt;
  double best = static_cast<double>(cap);
  if (limit_bytes > 0) {
    const double room = static_cast<double>(limit_bytes) - f->fixed;
    const double per_unit = f->per_unit + f->per_square * width;
    if (room <= 0) return std::int64_t{0};
    if (per_unit > 0) best = std::min(best, std::floor((1.0 - margin) * room / per_unit));
  }
  if (failed_units_ > 0) best = std::min(best, std::ceil(failed_units_) - 1.0);
  return static_cast<std::int64_t>(std::max(best, 0.0));
}

std::string MemoryModel::describe(const MemoryFit& fit, const std::string& unit) {
  std::ostringstream text;
  text << "fixed " << memory::format_bytes(std::llround(fit.fixed)) << " + "
       << memory::format_bytes(std::llround(fit.per_unit)) << "/" << unit;
  if (fit.per_square > 0) {
    text.precision(3);
    text << " + " << fit.per_square << " B/row x width^2";
  }
  return text.str();
}

}  // namespace autoaccum::train
