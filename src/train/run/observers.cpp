// Observers: the run log and the progress lines.
#include "autoaccum/train/run/observers.hpp"

#include "autoaccum/core/console.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <numeric>

#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"

namespace autoaccum::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string duration_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

std::string rate_text(double per_second) {
  char text[32];
  if (per_second >= 1e6)
    std::snprintf(text, sizeof text, "%.2fM", per_second / 1e6);
  else if (per_second >= 1000)
    std::snprintf(text, sizeof text, "%.1fk", per_second / 1000);
  else
    std::snprintf(text, sizeof text, "%.0f", per_second);
  return text;
}

}  // namespace

void RunLogObserver::on_oom(const OomEvent& event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < event.ranks.size(); ++i) {
    writer_.add(io::OomRow{event.step, event.ranks[i], event.micro_batches.at(i),
                           event.next.empty() ? 0 : event.next.at(i)});
  }
}

void RunLogObserver::on_prediction(const MemoryPrediction& event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : event.ranks) {
    io::MemoryModelRow row;
    row.step = event.step;
    row.rank = r.rank;
    row.limit_bytes = r.limit;
    row.fixed_bytes = r.fitted ? r.fit.fixed : -1.0;
    row.bytes_per_unit = r.fitted ? r.fit.per_unit : -1.0;
    row.bytes_per_square = r.fitted ? r.fit.per_square : -1.0;
    row.margin = event.margin;
    row.predicted = r.predicted;
    row.micro_batch = r.used;
    row.probe_attempts = event.probe_attempts;
    row.probe_seconds = event.seconds;
    writer_.add(row);
  }
}

void RunLogObserver::on_time_probe(const TimeProbe& event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& r : event.ranks) {
    io::TimeModelRow row;
    row.step = event.step;
    row.rank = r.rank;
    if (r.fit) {
      row.fixed_seconds = r.fit->fixed;
      row.seconds_per_token = r.fit->per_unit;
      row.seconds_per_square = r.fit->per_square;
      row.cost_fixed = r.fit->piece_cost().fixed;
      row.cost_width = r.fit->piece_cost().width;
      row.fit_error = r.error;
      row.predicted_step_seconds = r.step_seconds;
      row.half_budget_step_seconds = r.half_step_seconds;
    }
    row.micro_batch = r.budget;
    row.probe_attempts = event.probe_attempts;
    row.probe_seconds = event.seconds;
    writer_.add(row);
  }
}

void RunLogObserver::on_step(const io::StepRow& row, const RankFigures& ranks) {
  const std::lock_guard<std::mutex> lock(mutex_);
  writer_.add(row);
  writer_.set_peak_bytes(ranks.peak_bytes);
  logged_sizes_.resize(ranks.micro_batches.size(), {-1, -1});
  for (std::size_t r = 0; r < ranks.micro_batches.size(); ++r) {
    const std::pair<std::int64_t, std::int64_t> now{ranks.micro_batches[r], ranks.rows.at(r)};
    if (logged_sizes_[r] == now) continue;
    logged_sizes_[r] = now;
    writer_.add(io::RankSizeRow{row.step, static_cast<std::int64_t>(r), now.first, now.second});
  }
  final_micro_batch_ = row.micro_batch;
  ++steps_since_flush_;
  bool due = false;
  if (flush_every_ > 0) {
    due = steps_since_flush_ >= flush_every_;
  } else {
    // Fast steps would otherwise spend much of their time writing; a long log takes longer.
    const double since_flush = seconds_since(last_flush_);
    const double spacing = 50 * last_write_seconds_;
    due = since_flush >= spacing &&
          (row.oom_retries > 0 || (steps_since_flush_ >= 10 && since_flush >= 1.0) ||
           since_flush > std::max(5.0, spacing));
  }
  if (due) flush();
}

void RunLogObserver::flush() {
  const auto start = Clock::now();
  write("", "");
  last_write_seconds_ = seconds_since(start);
  steps_since_flush_ = 0;
  last_flush_ = Clock::now();
}

void RunLogObserver::on_checkpoint(std::int64_t step, std::int64_t bytes, double seconds) {
  const std::lock_guard<std::mutex> lock(mutex_);
  writer_.add(io::CheckpointRow{step, bytes, seconds});
  flush();
}

void RunLogObserver::on_eval(const EvalEvent& event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  writer_.add(io::EvalRow{event.step, event.loss, event.accuracy});
}

void RunLogObserver::on_finish(const std::string& status, const std::string& message,
                               std::int64_t final_micro_batch) {
  const std::lock_guard<std::mutex> lock(mutex_);
  final_micro_batch_ = final_micro_batch;
  write(status, message);
}

void RunLogObserver::write(const std::string& status, const std::string& message) {
  writer_.set_final_micro_batch(final_micro_batch_);
  try {
    if (status.empty())
      writer_.flush();
    else
      writer_.finish(status, message);
  } catch (const std::exception& e) {
    core::write_line(stderr, std::string("autoaccum: warning: run log not updated (") + e.what() +
                                 "); will retry");
  }
}

ProgressObserver::ProgressObserver(std::int64_t every, std::int64_t first_step,
                                   std::int64_t total_steps)
    : every_(every), first_step_(first_step), total_steps_(total_steps) {}

void ProgressObserver::on_oom(const OomEvent& event) {
  if (event.next.empty()) return;  // the run's error message says it
  const bool several = event.micro_batches.size() > 1 &&
                       std::any_of(event.micro_batches.begin(), event.micro_batches.end(),
                                   [&](std::int64_t m) { return m != event.micro_batches[0]; });
  std::cout << event.ranks_text << " ran out of memory at "
            << (event.tokens ? "token budget" : "micro-batch")
            << (several ? (event.tokens ? "s " : "es ") : " ")
            << (several ? sizes_text(event.micro_batches) : std::to_string(event.micro_batches[0]))
            << event.where_text << (event.probe ? " (a probe)" : "") << " (limit "
            << event.limit_text << "); ";
  if (!event.per_rank) {
    std::cout << "all " << event.world << " ranks continue at " << event.next[0] << std::endl;
  } else {
    std::cout << (event.ranks.size() > 1 ? "they continue at " : "it continues at ")
              << sizes_text(event.next)
              << (static_cast<std::int64_t>(event.ranks.size()) < event.world
                      ? "; the other ranks keep theirs"
                      : "")
              << std::endl;
  }
}

void ProgressObserver::on_step(const io::StepRow& row, const RankFigures& ranks) {
  const std::int64_t done = row.step + 1;
  samples_ += std::accumulate(ranks.rows.begin(), ranks.rows.end(), std::int64_t{0});
  tokens_ += row.tokens;
  if (every_ <= 0 || !(done % every_ == 0 || done == total_steps_ || done == first_step_ + 1))
    return;
  const double elapsed = seconds_since(start_);
  const double rate = static_cast<double>(samples_) / elapsed;
  const double eta =
      elapsed / static_cast<double>(done - first_step_) * static_cast<double>(total_steps_ - done);
  // "m 64 x 4", or per rank when the ranks differ: "m 16,32 x 4,2".
  std::string sizes = std::to_string(row.micro_batch) + " x " + std::to_string(row.accumulation);
  const auto& m = ranks.micro_batches;
  const bool differ =
      std::any_of(m.begin(), m.end(), [&](std::int64_t v) { return v != m.front(); }) ||
      std::any_of(ranks.rows.begin(), ranks.rows.end(),
                  [&](std::int64_t v) { return v > ranks.rows.front() + 1; });
  if (differ && m.size() == ranks.accumulation.size()) {
    std::string a = sizes_text(m), b = sizes_text(ranks.accumulation);
    a.erase(std::remove(a.begin(), a.end(), ' '), a.end());
    b.erase(std::remove(b.begin(), b.end(), ' '), b.end());
    sizes = a + " x " + b;
  }
  char line[1024];
  if (ranks.documents) {
    // Documents: "tokens 4096 x 3  pad 4%": budget x micro-batches, and the step's padding;
    // real tokens and documents per second since the start.
    const double padding = row.padded_tokens > 0
                               ? 100.0 * (1.0 - static_cast<double>(row.tokens) /
                                                    static_cast<double>(row.padded_tokens))
                               : 0.0;
    std::snprintf(line, sizeof line,
                  "step %lld/%lld  loss %.4f  lr %.4g  tokens %s  pad %.0f%%  %s tok/s  %s docs/s  "
                  "ETA %s",
                  static_cast<long long>(done), static_cast<long long>(total_steps_), row.loss,
                  row.lr, sizes.c_str(), padding,
                  rate_text(static_cast<double>(tokens_) / elapsed).c_str(),
                  rate_text(rate).c_str(), duration_text(eta).c_str());
    std::cout << line << std::endl;
    return;
  }
  std::snprintf(line, sizeof line, "step %lld/%lld  loss %.4f  lr %.4g  m %s  %s samples/s  ETA %s",
                static_cast<long long>(done), static_cast<long long>(total_steps_), row.loss,
                row.lr, sizes.c_str(), rate_text(rate).c_str(), duration_text(eta).c_str());
  std::cout << line << std::endl;
}

void ProgressObserver::on_eval(const EvalEvent& event) {
  char line[200];
  if (event.classification && event.unit == "token") {
    std::snprintf(line, sizeof line,
                  "eval  step %lld  loss %.4f per token (perplexity %.2f)  accuracy %.4f  "
                  "(%lld rows, %lld tokens)",
                  static_cast<long long>(event.step), event.loss, std::exp(event.loss),
                  event.accuracy, static_cast<long long>(event.rows),
                  static_cast<long long>(event.counted));
  } else if (event.classification) {
    std::snprintf(line, sizeof line, "eval  step %lld  loss %.4f  accuracy %.4f  (%lld rows)",
                  static_cast<long long>(event.step), event.loss, event.accuracy,
                  static_cast<long long>(event.rows));
  } else {
    std::snprintf(line, sizeof line, "eval  step %lld  loss %.6f per %s  (%lld rows)",
                  static_cast<long long>(event.step), event.loss, event.unit.c_str(),
                  static_cast<long long>(event.rows));
  }
  std::cout << line << std::endl;
}

void ProgressObserver::on_prediction(const MemoryPrediction& event) {
  // One line per rank up to 4 ranks; beyond, the ranks whose size differs from rank 0's.
  const std::string units = event.unit + "s";
  std::int64_t shown = 0;
  for (const auto& r : event.ranks) {
    const bool differs =
        r.used != event.ranks.front().used || r.predicted != event.ranks.front().predicted;
    if (event.ranks.size() > 4 && r.rank != 0 && !differs) continue;
    if (++shown > 8) break;
    std::cout << "memory model: rank " << r.rank << ": ";
    if (r.fitted) {
      std::cout << MemoryModel::describe(r.fit, event.unit) << "; predicted " << r.predicted << " "
                << units << " under "
                << (r.limit > 0 ? memory::format_bytes(r.limit) : std::string("no limit")) << " ("
                << std::lround(event.margin * 100) << "% margin)";
    } else {
      std::cout << "nothing to extrapolate from (the probes measured one size)";
    }
    std::cout << "; starts at " << r.used << " " << units << std::endl;
  }
  if (event.ranks.size() > 4)
    std::cout << "memory model: the other ranks start where rank 0 does" << std::endl;
  std::cout << "memory model: probed with " << event.probe_attempts << " attempts in " << std::fixed
            << std::setprecision(2) << event.seconds << " s" << std::endl;
  std::cout.unsetf(std::ios::floatfield);
}

void ProgressObserver::on_time_probe(const TimeProbe& event) {
  // One line per rank up to 4 ranks; beyond, rank 0's and the count of the others.
  std::int64_t shown = 0, others_fitted = 0;
  for (const auto& r : event.ranks) {
    if (r.fit && r.rank != 0) ++others_fitted;
    if (event.ranks.size() > 4 && r.rank != 0) continue;
    if (++shown > 4) break;
    std::cout << "time model: rank " << r.rank << ": ";
    if (r.fit) {
      const data::PieceCost cost = r.fit->piece_cost();
      std::cout << r.fit->describe() << " per micro-batch (within " << std::lround(r.error * 100)
                << "% of the probe's pieces): each costs " << std::lround(cost.fixed)
                << " padded tokens' time";
      if (cost.width > 0)
        std::cout << ", a padded token at width " << event.widest << " " << std::setprecision(3)
                  << 1 + cost.width * static_cast<double>(event.widest) << " tokens'";
      std::cout << "; cuts its " << r.budget << "-token budget by predicted time";
      if (r.step_seconds > 0) {
        std::cout << ", " << std::fixed << std::setprecision(3) << r.step_seconds
                  << " s of compute per step";
        if (r.half_step_seconds > 0)
          std::cout << " (at half the budget " << r.half_step_seconds << " s, " << std::showpos
                    << std::setprecision(1) << 100 * (r.half_step_seconds / r.step_seconds - 1)
                    << "%" << std::noshowpos << ")";
        std::cout.unsetf(std::ios::floatfield);
      }
      std::cout << std::endl;
    } else {
      std::cout << "too little timed to fit; cuts into the fewest micro-batches" << std::endl;
    }
  }
  if (event.ranks.size() > 4)
    std::cout << "time model: " << others_fitted << " of the other " << event.ranks.size() - 1
              << " ranks fitted too" << std::endl;
  std::cout << "time model: probed with " << event.probe_attempts << " attempts in " << std::fixed
            << std::setprecision(2) << event.seconds << " s" << std::endl;
  std::cout.unsetf(std::ios::floatfield);
}

void ProgressObserver::on_message(const std::string& line) {
  std::cout << line << std::endl;
}

}  // namespace autoaccum::train
