// autoaccum log: a run log as a person reads it, as CSV, or several runs side by side.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <map>
#include <numeric>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"
#include "autoaccum/train/sizing/time_model.hpp"
#include "commands.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {
namespace {

using io::RunLogData;

std::vector<double> values(const RunLogData& log, const std::string& group,
                           const std::string& name) {
  const auto* c = log.column(group, name);
  return c ? c->values : std::vector<double>{};
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string number(double v, const char* format = "%.4g") {
  if (std::isnan(v)) return "-";
  char text[64];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

// The shortest text that reads back as exactly `v` (0.05, not 0.050000000000000003).
std::string exact_number(double v) {
  if (std::isnan(v)) return "-";
  char text[64];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return text;
}

std::string integer(double v) {
  return std::isnan(v) ? "-" : std::to_string(static_cast<long long>(v));
}

// Median samples/s over steps without OOM retries (those include the search).
double steady_throughput(const RunLogData& log) {
  const auto rate = values(log, "steps", "samples_per_second");
  const auto retries = values(log, "steps", "oom_retries");
  std::vector<double> clean;
  for (std::size_t i = 0; i < rate.size(); ++i) {
    if (i < retries.size() && retries[i] > 0) continue;
    clean.push_back(rate[i]);
  }
  // The first step pays for start-up (first touches, prefetch warm-up): leave it out when possible.
  if (clean.size() > 2) clean.erase(clean.begin());
  return median(clean);
}

// Document data: sizes are budgets of padded tokens (schema 6).
bool sizes_are_tokens(const RunLogData& log) {
  return log.attribute("micro_batch_unit") == "tokens";
}

// The run: its status, ranks, batch, memory limit, precision, model and data.
void print_run(const RunLogData& log, std::ostream& out) {
  const std::string status = log.attribute("status", "unknown");
  const bool tokens = sizes_are_tokens(log);
  const std::string batch_tokens = log.attribute("global_batch_tokens", "0");
  const bool by_tokens = !batch_tokens.empty() && std::stod(batch_tokens) > 0;
  out << log.path << ": " << status << "\n";
  if (status == "failed") out << "  error: " << log.attribute("error") << "\n";
  const std::string nodes = log.attribute("nodes");
  out << "  " << log.attribute("world_size") << " rank(s)"
      << (nodes.empty() ? std::string() : " on " + nodes + " node(s)") << ", global batch "
      << (by_tokens ? "up to " + integer(std::stod(batch_tokens)) + " tokens"
                    : log.attribute("global_batch"))
      << (tokens ? (by_tokens ? ", micro-batch tokens " : " documents, micro-batch tokens ")
                 : ", micro-batch ")
      << log.attribute("micro_batch_mode") << ", memory limit "
      << log.attribute("memory_limit", "none") << ", precision "
      << log.attribute("precision", "fp32") << "\n";
  out << "  model " << log.attribute("model", "?") << ", optimizer "
      << log.attribute("optimizer", "?") << ", lr " << log.attribute("lr", "?") << ", data "
      << log.attribute("data", "?") << "\n";
}

void print_overlap(const RunLogData& log, std::ostream& out) {
  // --overlap: how the gradients travelled, and what of it the steps waited for.
  const std::string overlap = log.attribute("overlap");
  if (!overlap.empty() && log.attribute("world_size") != "1") {
    out << "  gradient all-reduce " << overlap;
    std::vector<double> waited = values(log, "steps", "allreduce_seconds");
    if (!waited.empty()) {
      std::nth_element(waited.begin(), waited.begin() + waited.size() / 2, waited.end());
      std::ostringstream ms;
      ms << std::fixed << std::setprecision(1) << waited[waited.size() / 2] * 1000.0;
      out << "; " << (overlap.rfind("overlapped", 0) == 0 ? "exposed " : "") << ms.str()
          << " ms per step (median)";
    }
    out << "\n";
  }
}

void print_shard(const RunLogData& log, std::ostream& out) {
  // --shard (schema 12): each rank's fixed bytes (counted from the sizes: parameters, gradients,
  // optimizer state) as the run held them, against unsharded.
  const std::string counted = log.attribute("fixed_bytes_counted");
  if (!counted.empty() && log.attribute("world_size") != "1") {
    std::vector<std::int64_t> each;
    std::stringstream list(counted);
    for (std::string item; std::getline(list, item, ',');)
      each.push_back(std::stoll(item));
    const std::int64_t most = *std::max_element(each.begin(), each.end());
    const std::int64_t least = *std::min_element(each.begin(), each.end());
    out << "  shard " << log.attribute("shard", "none") << ": fixed bytes per rank "
        << memory::format_bytes(most);
    if (least != most) out << " (least " << memory::format_bytes(least) << ")";
    // Every other level's count, where the log has it (unsharded's since schema 12, the optimizer
    // and gradients levels' since 15).
    const std::string shard = log.attribute("shard", "none");
    for (const char* level : {"none", "optimizer", "gradients"}) {
      const std::string other = log.attribute(std::string("fixed_bytes_counted_") +
                                              (level == std::string("none") ? "unsharded" : level));
      if (shard == level || other.empty()) continue;
      out << ", " << memory::format_bytes(static_cast<std::int64_t>(std::stod(other)))
          << (level == std::string("none") ? " without sharding"
                                           : std::string(" with --shard ") + level);
    }
    out << "\n";
  }
}

// --precision fp16: the loss scale at the first and last step, and the steps it skipped.
void print_loss_scale(const RunLogData& log, std::ostream& out) {
  if (log.attribute("precision") == "fp16") {
    const auto scale = values(log, "steps", "loss_scale");
    const auto skipped = values(log, "steps", "skipped");
    const auto steps = values(log, "steps", "step");
    if (!scale.empty() && steps.size() == scale.size()) {
      const double count = std::accumulate(skipped.begin(), skipped.end(), 0.0);
      out << "  loss scale " << scale.front() << " at step " << integer(steps.front()) << ", "
          << scale.back() << " at step " << integer(steps.back()) << " (" << integer(count)
          << " step(s) skipped for overflow or non-finite values)\n";
    }
  }
}

// When it started, how, and each resume.
void print_origin(const RunLogData& log, std::ostream& out) {
  out << "  started " << log.attribute("started_at") << ", updated "
      << log.attribute("updated_at", "-") << "\n";
  out << "  command: " << log.attribute("command_line") << "\n";
  // Each resume: where, on how many ranks, and whether --resume-reshape changed the data order.
  const auto resumed_at = values(log, "resumes", "step");
  const auto resumed_ranks = values(log, "resumes", "world_size");
  const auto resumed_batch = values(log, "resumes", "global_batch");
  const auto reshaped = values(log, "resumes", "reshaped");
  const auto resumed_from = log.attribute_list("resume_checkpoints");
  const auto resume_skipped = log.attribute_list("resume_skipped");
  for (std::size_t i = 0; i < resumed_at.size(); ++i) {
    out << "  resumed at step " << integer(resumed_at[i]);
    if (i < resumed_ranks.size() && resumed_ranks[i] > 0)
      out << " on " << integer(resumed_ranks[i]) << " rank(s)";
    if (i < resumed_batch.size() && resumed_batch[i] > 0)
      out << ", global batch " << integer(resumed_batch[i]);
    if (i < reshaped.size() && reshaped[i] > 0)
      out << " (--resume-reshape: a new data order from this epoch on)";
    if (i < resumed_from.size() && !resumed_from[i].empty()) out << ", from " << resumed_from[i];
    out << "\n";
    if (i < resume_skipped.size() && !resume_skipped[i].empty())
      out << "    skipped: " << resume_skipped[i] << "\n";
  }
}

void print_checkpoints(const RunLogData& log, std::ostream& out) {
  // Checkpoints (schema 9): how many, the last, and what writing them cost.
  const auto saved_at = values(log, "checkpoints", "step");
  const auto saved_bytes = values(log, "checkpoints", "bytes");
  const auto saved_seconds = values(log, "checkpoints", "seconds");
  if (!saved_at.empty() && saved_bytes.size() == saved_at.size() &&
      saved_seconds.size() == saved_at.size()) {
    const double seconds = std::accumulate(saved_seconds.begin(), saved_seconds.end(), 0.0);
    std::ostringstream line;
    line << std::fixed << std::setprecision(1) << saved_bytes.back() / 1048576.0 << " MiB in "
         << std::setprecision(2) << saved_seconds.back() << " s; " << seconds << " s in all";
    out << "  " << saved_at.size() << " checkpoint(s), the last after step "
        << integer(saved_at.back()) << ": " << line.str() << "\n";
  }
}

// The timeline's events in step order: OOM events grouped by (step, size), which ranks, what next
// and the accumulation that followed; and the steps where the size grew (--micro-batch-search
// refine).
std::vector<std::string> timeline_events(const RunLogData& log) {
  const auto step = values(log, "steps", "step");
  const auto micro = values(log, "steps", "micro_batch");
  const auto accumulation = values(log, "steps", "accumulation");
  const auto oom_step = values(log, "oom", "step");
  const auto oom_rank = values(log, "oom", "rank");
  const auto oom_micro = values(log, "oom", "micro_batch");
  const auto oom_next = values(log, "oom", "next_micro_batch");
  std::vector<std::pair<std::pair<double, std::size_t>, std::string>> events;
  for (std::size_t k = 1; k < micro.size(); ++k) {
    if (micro[k] > micro[k - 1]) {
      std::ostringstream line;
      line << "  step " << integer(step[k]) << ": " << integer(micro[k])
           << " fitted (a probe upwards), accumulation " << integer(accumulation[k]) << "\n";
      events.push_back({{step[k], 0}, line.str()});
    }
  }
  for (std::size_t i = 0; i < oom_step.size();) {
    std::size_t j = i;
    std::ostringstream ranks, line;
    while (j < oom_step.size() && oom_step[j] == oom_step[i] && oom_micro[j] == oom_micro[i]) {
      ranks << (j > i ? ", " : "") << integer(oom_rank[j]);
      ++j;
    }
    line << "  step " << integer(oom_step[i]) << ": " << integer(oom_micro[i])
         << " did not fit on rank" << (j - i > 1 ? "s " : " ") << ranks.str();
    if (oom_next[i] > 0) {
      line << " -> " << integer(oom_next[i]);
      // The accumulation that followed, from the step that succeeded at that size.
      for (std::size_t k = 0; k < step.size(); ++k) {
        if (step[k] >= oom_step[i] && micro[k] == oom_next[i]) {
          line << ", accumulation " << integer(accumulation[k]) << ", from step "
               << integer(step[k]) << " on";
          break;
        }
      }
    } else {
      line << " -> no smaller size: the run stopped";
    }
    events.push_back({{oom_step[i], 1 + i}, line.str() + "\n"});
    i = j;
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> lines;
  for (auto& event : events)
    lines.push_back(std::move(event.second));
  return lines;
}

// Where the micro-batch started, what changed it, where it ended, and every rank's micro-batches.
void print_timeline(const RunLogData& log, std::ostream& out) {
  const auto step = values(log, "steps", "step");
  const auto micro = values(log, "steps", "micro_batch");
  const auto accumulation = values(log, "steps", "accumulation");
  const auto oom_step = values(log, "oom", "step");
  const auto oom_micro = values(log, "oom", "micro_batch");

  out << (sizes_are_tokens(log) ? "\nToken budget timeline (padded tokens per micro-batch):\n"
                                : "\nMicro-batch timeline:\n");
  if (!micro.empty()) {
    // The size the run started at: the first failed size when the first step had OOMs.
    const bool first_failed = !oom_step.empty() && oom_step.front() == step.front();
    out << "  step " << integer(step.front()) << ": started at "
        << integer(first_failed ? oom_micro.front() : micro.front()) << "\n";
  }
  for (const std::string& line : timeline_events(log))
    out << line;
  out << "  final micro-batch " << log.attribute("final_micro_batch");
  if (!accumulation.empty()) out << " (accumulation " << integer(accumulation.back()) << ")";
  out << " after " << step.size() << " logged step(s)\n";
  // Every rank's micro-batches (schema 10): shown where another rank ran more than rank 0.
  const auto most = values(log, "steps", "accumulation_max");
  const auto most_rank = values(log, "steps", "accumulation_max_rank");
  if (!most.empty() && most.size() == accumulation.size() && most_rank.size() == most.size() &&
      !std::equal(most.begin(), most.end(), accumulation.begin())) {
    const auto top = static_cast<std::size_t>(
        std::distance(most.begin(), std::max_element(most.begin(), most.end())));
    const auto [low, high] = std::minmax_element(accumulation.begin(), accumulation.end());
    out << "  micro-batches per step: rank 0 ran " << integer(*low);
    if (*high > *low) out << "-" << integer(*high);
    out << "; the most on one rank " << integer(most[top]) << " (rank " << integer(most_rank[top])
        << ", step " << integer(step[top]) << ")\n";
  }
}

// The memory model's prediction per rank (schema 7, --micro-batch-search predict).
void print_memory_model(const RunLogData& log, std::ostream& out) {
  const auto oom_rank = values(log, "oom", "rank");
  const auto model_rank = values(log, "memory_model", "rank");
  if (!model_rank.empty()) {
    const auto fixed = values(log, "memory_model", "fixed_bytes");
    const auto per_unit = values(log, "memory_model", "bytes_per_unit");
    const auto per_square = values(log, "memory_model", "bytes_per_square");
    const auto predicted = values(log, "memory_model", "predicted");
    const auto used = values(log, "memory_model", "micro_batch");
    const auto margin = values(log, "memory_model", "margin");
    const auto attempts = values(log, "memory_model", "probe_attempts");
    const auto probe_seconds = values(log, "memory_model", "probe_seconds");
    const std::string unit = sizes_are_tokens(log) ? "token" : "row";
    out << "\nMemory model (probed in " << integer(attempts.front()) << " attempts, "
        << number(probe_seconds.front(), "%.2f") << " s; " << number(100 * margin.front(), "%.0f")
        << "% of the room kept free):\n";
    for (std::size_t i = 0; i < model_rank.size(); ++i) {
      const auto ran_out = std::count(oom_rank.begin(), oom_rank.end(), model_rank[i]);
      out << "  rank " << integer(model_rank[i]) << ": ";
      if (fixed[i] >= 0) {
        out << "predicted " << integer(predicted[i]) << " " << unit << "s ("
            << train::MemoryModel::describe(
                   train::MemoryFit{fixed[i], per_unit[i], std::max(per_square[i], 0.0)}, unit)
            << ")";
      } else {
        out << "no prediction (one size measured)";
      }
      out << ", used " << integer(used[i]) << ", "
          << (ran_out == 0 ? std::string("no out-of-memory")
                           : std::to_string(ran_out) + " out-of-memory event(s)")
          << "\n";
    }
  }
}

// Documents cut by predicted time (--micro-batch-cost auto, schema 14): each rank's time fit.
void print_time_fits(const RunLogData& log, std::ostream& out) {
  const std::string cut = log.attribute("micro_batch_cost");
  if (!cut.empty()) out << "\nDocuments cut " << cut << "\n";
  const auto time_rank = values(log, "time_model", "rank");
  const auto time_fixed = values(log, "time_model", "fixed_seconds");
  const auto time_unit = values(log, "time_model", "seconds_per_token");
  const auto time_square = values(log, "time_model", "seconds_per_square");
  const auto time_budget = values(log, "time_model", "micro_batch");
  const auto time_error = values(log, "time_model", "fit_error");
  const auto time_step = values(log, "time_model", "step");
  const auto time_at_budget = values(log, "time_model", "predicted_step_seconds");
  const auto time_at_half = values(log, "time_model", "half_budget_step_seconds");
  const std::size_t shown_ranks = 8;
  for (std::size_t i = 0; i < time_rank.size() && i < time_unit.size(); ++i) {
    if (i == shown_ranks) {
      out << "  (" << time_rank.size() - shown_ranks << " more ranks in time_model)\n";
      break;
    }
    out << "  rank " << integer(time_rank[i]) << " (probed before step " << integer(time_step[i])
        << "): ";
    if (!(time_unit[i] > 0)) {
      out << "no time fit (too little timed): the fewest micro-batches\n";
      continue;
    }
    const train::TimeFit fit{time_fixed[i], time_unit[i], std::max(time_square[i], 0.0)};
    const data::PieceCost cost = fit.piece_cost();
    out << fit.describe() << " per micro-batch, within " << number(time_error[i] * 100, "%.0f")
        << "% of its probe's pieces; a micro-batch costs " << number(cost.fixed, "%.0f")
        << " padded tokens' time";
    if (cost.width > 0)
      out << ", a padded token " << number(cost.width, "%.3g") << " more per unit of width";
    out << "; budget " << integer(time_budget[i]) << " tokens";
    if (i < time_at_budget.size() && time_at_budget[i] > 0) {
      out << ", predicted " << number(time_at_budget[i], "%.3f") << " s of compute per step";
      if (i < time_at_half.size() && time_at_half[i] > 0)
        out << " (" << number(time_at_half[i], "%.3f")
            << " s at half the budget: a larger one never predicts slower)";
    }
    out << "\n";
  }
}

// Rank 0's predicted compute per step against its measured, medians over the steps without an
// out-of-memory retry.
void print_predicted_compute(const RunLogData& log, std::ostream& out) {
  const auto predicted = values(log, "steps", "predicted_compute_seconds");
  const auto measured = values(log, "steps", "compute_seconds");
  const auto retried = values(log, "steps", "oom_retries");
  std::vector<double> p, m, ratio;
  for (std::size_t s = 0; s < predicted.size() && s < measured.size(); ++s) {
    if (!(predicted[s] > 0) || !(measured[s] > 0) || (s < retried.size() && retried[s] > 0))
      continue;
    p.push_back(predicted[s]);
    m.push_back(measured[s]);
    ratio.push_back(measured[s] / predicted[s]);
  }
  if (!p.empty()) {
    std::vector<double> sorted = ratio;
    std::sort(sorted.begin(), sorted.end());
    out << "  rank 0's compute per step, median over " << p.size() << " steps: predicted "
        << number(median(p), "%.3f") << " s, measured " << number(median(m), "%.3f")
        << " s; measured / predicted " << number(median(ratio), "%.2f") << " (from "
        << number(sorted.front(), "%.2f") << " to " << number(sorted.back(), "%.2f") << ")\n";
  }
}

void print_oom_events(const RunLogData& log, std::ostream& out) {
  const auto oom_step = values(log, "oom", "step");
  const auto oom_rank = values(log, "oom", "rank");
  const auto oom_micro = values(log, "oom", "micro_batch");
  const auto oom_next = values(log, "oom", "next_micro_batch");
  out << "\nOOM events: " << oom_step.size() << "\n";
  if (!oom_step.empty()) {
    out << "  step   rank  micro_batch  next\n";
    for (std::size_t i = 0; i < oom_step.size(); ++i) {
      char line[96];
      std::snprintf(line, sizeof line, "  %-6s %-5s %-12s %s\n", integer(oom_step[i]).c_str(),
                    integer(oom_rank[i]).c_str(), integer(oom_micro[i]).c_str(),
                    oom_next[i] > 0 ? integer(oom_next[i]).c_str() : "stop");
      out << line;
    }
  }
}

// Throughput, the share of step time spent waiting for data, tokens and padding, the loss.
void print_throughput(const RunLogData& log, std::ostream& out) {
  const auto wait = values(log, "steps", "data_wait_seconds");
  const auto seconds = values(log, "steps", "step_seconds");
  double wait_sum = 0, step_sum = 0;
  for (double w : wait)
    wait_sum += w;
  for (double s : seconds)
    step_sum += s;
  out << "\nThroughput: median " << number(steady_throughput(log), "%.0f")
      << " samples/s (steps without OOM retries)";
  if (step_sum > 0)
    out << "; waiting for data " << number(100.0 * wait_sum / step_sum, "%.2f") << "% of step time";
  out << "\n";
  if (sizes_are_tokens(log)) {
    const auto real = values(log, "steps", "tokens");
    const auto padded = values(log, "steps", "padded_tokens");
    const double real_sum = std::accumulate(real.begin(), real.end(), 0.0);
    const double padded_sum = std::accumulate(padded.begin(), padded.end(), 0.0);
    out << "Tokens: " << integer(real_sum) << " trained, " << integer(padded_sum)
        << " processed with padding ("
        << number(padded_sum > 0 ? 100.0 * (1 - real_sum / padded_sum) : 0.0, "%.1f")
        << "% padding)";
    if (step_sum > 0) out << ", " << number(real_sum / step_sum, "%.0f") << " tokens/s";
    out << "\n";
  }
  const auto loss = values(log, "steps", "loss");
  if (!loss.empty())
    out << "Loss: first " << number(loss.front()) << ", last " << number(loss.back()) << "\n";
}

void print_evaluation(const RunLogData& log, std::ostream& out) {
  const auto eval_step = values(log, "eval", "step");
  const auto eval_loss = values(log, "eval", "loss");
  const auto eval_accuracy = values(log, "eval", "accuracy");
  if (!eval_step.empty()) {
    out << "\nEvaluation:\n";
    for (std::size_t i = 0; i < eval_step.size(); ++i) {
      out << "  step " << integer(eval_step[i]) << ": loss " << number(eval_loss[i])
          << ", accuracy " << number(eval_accuracy[i], "%.4f") << "\n";
    }
  }
}

void print_ranks(const RunLogData& log, std::ostream& out) {
  const auto rank = values(log, "ranks", "rank");
  const auto peak = values(log, "ranks", "peak_bytes");
  // Each rank's sizes over the run (schema 3): "micro-batch 128 -> 64 -> 32 on 64 rows".
  const auto size_rank = values(log, "rank_sizes", "rank");
  const auto size_micro = values(log, "rank_sizes", "micro_batch");
  const auto size_rows = values(log, "rank_sizes", "rows");
  if (!rank.empty()) {
    out << "\nRanks:\n";
    for (std::size_t i = 0; i < rank.size(); ++i) {
      out << "  rank " << integer(rank[i]) << " on "
          << (i < log.hostnames.size() ? log.hostnames[i] : "?") << ", peak "
          << memory::format_bytes(static_cast<std::int64_t>(peak[i]));
      std::string sizes;
      double last_micro = -1, last_rows = -1;
      for (std::size_t k = 0; k < size_rank.size(); ++k) {
        if (size_rank[k] != rank[i]) continue;
        if (size_micro[k] != last_micro)
          sizes += (sizes.empty() ? "" : " -> ") + integer(size_micro[k]);
        last_micro = size_micro[k];
        last_rows = size_rows[k];
      }
      if (!sizes.empty())
        out << ", micro-batch " << sizes << " on " << integer(last_rows) << " rows";
      out << "\n";
    }
  }
}

void print_summary(const RunLogData& log, std::ostream& out) {
  print_run(log, out);
  print_overlap(log, out);
  print_shard(log, out);
  print_loss_scale(log, out);
  print_origin(log, out);
  print_checkpoints(log, out);
  print_timeline(log, out);
  print_memory_model(log, out);
  print_time_fits(log, out);
  print_predicted_compute(log, out);
  print_oom_events(log, out);
  print_throughput(log, out);
  print_evaluation(log, out);
  print_ranks(log, out);
  out << "\nStatus: " << log.attribute("status", "unknown") << "\n";
}

void print_csv(const RunLogData& log, const std::string& group, std::ostream& out) {
  const auto it = log.groups.find(group);
  if (it == log.groups.end()) {
    throw UsageError("--csv: '" + group +
                     "' is not one of steps, oom, eval, ranks, resumes, rank_sizes, "
                     "memory_model, checkpoints");
  }
  const auto& columns = it->second;
  for (std::size_t c = 0; c < columns.size(); ++c)
    out << (c ? "," : "") << columns[c].name;
  if (group == "ranks") out << ",hostname";
  out << "\n";
  const std::size_t rows = columns.empty() ? 0 : columns.front().values.size();
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const double v = r < columns[c].values.size() ? columns[c].values[r] : std::nan("");
      out << (c ? "," : "") << (columns[c].integer ? integer(v) : exact_number(v));
    }
    if (group == "ranks") out << "," << (r < log.hostnames.size() ? log.hostnames[r] : "");
    out << "\n";
  }
}

void print_comparison(const std::vector<RunLogData>& logs, std::ostream& out) {
  char line[400];
  std::snprintf(line, sizeof line, "%-40s %-10s %5s %8s %7s %5s %5s %12s %9s %9s\n", "run",
                "status", "world", "global", "micro", "accum", "ooms", "samples/s", "loss",
                "accuracy");
  out << line;
  for (const auto& log : logs) {
    const auto accumulation = values(log, "steps", "accumulation");
    const auto loss = values(log, "steps", "loss");
    const auto accuracy = values(log, "eval", "accuracy");
    std::snprintf(line, sizeof line, "%-40s %-10s %5s %8s %7s %5s %5zu %12s %9s %9s\n",
                  log.path.c_str(), log.attribute("status").c_str(),
                  log.attribute("world_size").c_str(), log.attribute("global_batch").c_str(),
                  log.attribute("final_micro_batch").c_str(),
                  accumulation.empty() ? "-" : integer(accumulation.back()).c_str(),
                  values(log, "oom", "step").size(), number(steady_throughput(log), "%.0f").c_str(),
                  loss.empty() ? "-" : number(loss.back()).c_str(),
                  accuracy.empty() ? "-" : number(accuracy.back(), "%.4f").c_str());
    out << line;
  }
}

}  // namespace

Command log_command() {
  Command c;
  c.name = "log";
  c.summary = "Summarise run logs: micro-batch sizes chosen and why, OOMs, throughput, evaluation.";
  c.usage =
      "autoaccum log RUN.h5 [RUN2.h5 ...] [--csv "
      "steps|oom|eval|ranks|resumes|rank_sizes|memory_model|checkpoints]";
  c.options.add_options()("logs",
                          po::value<std::vector<std::string>>()->required()->value_name("RUN.h5"),
                          "run log(s); several give a comparison table")(
      "csv", po::value<std::string>()->value_name("GROUP"), "print one group of one log as CSV");
  c.positional.add("logs", -1);
  c.run = [](const po::variables_map& vm, comm::Communicator& world) {
    comm::collectively(world, [&] {
      if (world.rank() != 0) return;
      // A quoted glob ('runs/*.h5', as a job script passes it) expands as --data's does.
      const auto paths =
          data::expand_data_paths(vm["logs"].as<std::vector<std::string>>(), "autoaccum log");
      std::vector<RunLogData> logs;
      // Comparing several: a log that cannot be read is named and left out, not fatal.
      for (const auto& p : paths) {
        if (paths.size() == 1 || vm.count("csv")) {
          logs.push_back(io::read_run_log(p));
          continue;
        }
        try {
          logs.push_back(io::read_run_log(p));
        } catch (const Error& e) {
          std::cerr << "autoaccum log: skipping " << e.what() << std::endl;
        }
      }
      if (logs.empty())
        throw InputError("none of the " + std::to_string(paths.size()) + " run logs could be read");
      std::ostringstream out;
      if (vm.count("csv")) {
        if (logs.size() != 1) throw UsageError("--csv takes exactly one run log");
        print_csv(logs.front(), vm["csv"].as<std::string>(), out);
      } else if (logs.size() == 1) {
        print_summary(logs.front(), out);
      } else {
        print_comparison(logs, out);
      }
      std::cout << out.str() << std::flush;
    });
    return 0;
  };
  return c;
}

}  // namespace autoaccum::cli
