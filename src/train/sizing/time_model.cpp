// fit_time: a rank's compute time per micro-batch of documents as fixed + per padded token + per
// row x width^2, by non-negative least squares on relative errors.
#include "autoaccum/train/sizing/time_model.hpp"

#include <array>
#include <cmath>
#include <cstdio>

namespace autoaccum::train {

MicroBatchShape piece_shape(const data::MicroBatchPiece& piece) {
  const auto units = static_cast<double>(piece.size());
  return MicroBatchShape{units, piece.width > 0 ? units * static_cast<double>(piece.width) : 0.0};
}

namespace {

// Solves the n x n system a x = b (n <= 3) by Gaussian elimination with partial pivoting; false
// when it is singular (a coefficient the points cannot tell apart from the others).
bool solve(std::array<std::array<double, 3>, 3> a, std::array<double, 3> b, int n,
           std::array<double, 3>& x) {
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    if (!(std::abs(a[pivot][c]) > 1e-12 * (std::abs(a[c][c]) + 1e-300))) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (int r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < n; ++k)
        a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = n - 1; c >= 0; --c) {
    double s = b[c];
    for (int k = c + 1; k < n; ++k)
      s -= a[c][k] * x[k];
    x[c] = s / a[c][c];
    if (!std::isfinite(x[c])) return false;
  }
  return true;
}

}  // namespace

std::string TimeFit::describe() const {
  const auto time = [](double seconds) {
    char text[32];
    if (seconds >= 1)
      std::snprintf(text, sizeof text, "%.3g s", seconds);
    else if (seconds >= 1e-3)
      std::snprintf(text, sizeof text, "%.3g ms", seconds * 1e3);
    else if (seconds >= 1e-6)
      std::snprintf(text, sizeof text, "%.3g us", seconds * 1e6);
    else
      std::snprintf(text, sizeof text, "%.3g ns", seconds * 1e9);
    return std::string(text);
  };
  std::string text = time(fixed) + " + " + time(per_unit) + "/token";
  if (per_square > 0) text += " + " + time(per_square) + "/token x width";
  return text;
}

std::optional<TimeFit> fit_time(const std::vector<std::pair<MicroBatchShape, double>>& timed) {
  // Features (1, units, square) of every usable point, each row scaled by 1 / its time.
  std::vector<std::array<double, 3>> rows;
  for (const auto& [shape, seconds] : timed) {
    if (!(seconds > 0) || !std::isfinite(seconds) || !(shape.units > 0)) continue;
    rows.push_back({1 / seconds, shape.units / seconds, shape.square / seconds});
  }
  if (rows.size() < 2) return std::nullopt;
  // Each set of coefficients that holds per_unit (bit 1): {per_unit}, {fixed, per_unit},
  // {per_unit, per_square}, all three. Unused ones are 0.
  std::optional<TimeFit> best;
  double best_error = 0;
  for (const unsigned set : {2u, 3u, 6u, 7u}) {
    std::array<int, 3> used{};
    int n = 0;
    for (int k = 0; k < 3; ++k)
      if (set & (1u << k)) used[n++] = k;
    if (static_cast<std::size_t>(n) > rows.size()) continue;
    std::array<std::array<double, 3>, 3> a{};
    std::array<double, 3> b{}, x{};
    for (const auto& row : rows) {
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j)
          a[i][j] += row[used[i]] * row[used[j]];
        b[i] += row[used[i]];  // the target, seconds / seconds
      }
    }
    if (!solve(a, b, n, x)) continue;
    std::array<double, 3> c{};
    for (int i = 0; i < n; ++i)
      c[used[i]] = x[i];
    if (c[0] < 0 || !(c[1] > 0) || c[2] < 0) continue;
    double error = 0;
    for (const auto& row : rows) {
      const double r = c[0] * row[0] + c[1] * row[1] + c[2] * row[2] - 1;
      error += r * r;
    }
    // A tie keeps the set with fewer coefficients (tried first).
    if (!best || error < best_error * (1 - 1e-12)) {
      best = TimeFit{c[0], c[1], c[2]};
      best_error = error;
    }
  }
  return best;
}

}  // namespace autoaccum::train
