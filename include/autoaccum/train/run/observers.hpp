// Observers: what hangs off the step loop without living in it (run log rows, progress lines).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/io/run_log.hpp"
#include "autoaccum/train/sizing/memory_model.hpp"
#include "autoaccum/train/sizing/time_model.hpp"

namespace autoaccum::train {

// An agreed out-of-memory: every rank builds the same event from the reduced flags.
struct OomEvent {
  std::int64_t step = 0;
  std::vector<int> ranks;  // those that ran out
  std::string ranks_text;  // "rank 1" / "ranks 0, 2"
  std::string where_text;  // " in backward" / " (rank 0 in forward, rank 1 in backward)"
  std::vector<std::int64_t> micro_batches;  // aligned with `ranks`: the size each ran out at
  std::vector<std::int64_t> next;  // aligned with `ranks`: each one's next size; empty: the run
                                   // cannot shrink further and stops
  bool per_rank = false;           // --micro-batch-scope rank: the other ranks keep their sizes
  bool probe = false;              // the size was a refine probe
  bool tokens = false;             // document data: the sizes are token budgets
  std::int64_t world = 1;
  std::string limit_text;  // "16.0 MiB per rank" | "no --memory-limit"
};

// The memory probe's outcome (--micro-batch-search predict): every rank's fitted memory model
// and the micro-batch it starts at; every rank builds the same event.
struct MemoryPrediction {
  std::int64_t step = 0;
  std::string unit = "row";  // "row" or "token" (document budgets)
  double margin = 0;         // --memory-margin
  std::int64_t probe_attempts = 0;
  double seconds = 0;  // the probe's time
  struct Rank {
    int rank = 0;
    std::int64_t limit = 0;      // bytes (0: none)
    bool fitted = false;         // a model could be fitted
    MemoryFit fit;               // when fitted
    std::int64_t predicted = 0;  // its largest size under the limit and margin (-1: none)
    std::int64_t used = 0;       // the size it starts at (scope global: the smallest)
  };
  std::vector<Rank> ranks;
};

// The time probe's outcome (documents, --micro-batch-cost auto): every rank's fitted compute time
// per micro-batch, which the planner cuts its documents by; every rank builds the same event.
struct TimeProbe {
  std::int64_t step = 0;
  std::int64_t probe_attempts = 0;
  double seconds = 0;       // the probe's time
  std::int64_t widest = 0;  // the data's longest document
  struct Rank {
    int rank = 0;
    std::optional<TimeFit> fit;  // none: too little timed (the fewest pieces)
    std::int64_t budget = 0;     // the budget it cuts with
    double error = -1;           // the fit's largest error relative to a timed piece
    // Its compute per step over the next steps' shares as the fit predicts it, cut under the
    // budget and under half of it (-1: half would not hold the longest document).
    double step_seconds = -1, half_step_seconds = -1;
    std::int64_t steps = 0;  // the steps those are averaged over
  };
  std::vector<Rank> ranks;
};

// Every rank's figures at a finished step, indexed by rank.
struct RankFigures {
  std::vector<std::int64_t> peak_bytes;     // the largest peak each has reported so far
  std::vector<std::int64_t> micro_batches;  // the size each used in the step
  std::vector<std::int64_t> rows;           // its part of the global batch
  std::vector<std::int64_t> accumulation;   // how many micro-batches each ran in the step
  bool documents = false;                   // document data: sizes are token budgets
};

// "64" or "64, 32" (a list of sizes for messages).
std::string sizes_text(const std::vector<std::int64_t>& sizes);

struct EvalEvent {
  std::int64_t step = 0;
  double loss = 0;
  double accuracy = 0;  // NaN for regression
  bool classification = true;
  std::int64_t rows = 0;
  std::int64_t counted = 0;  // what the loss averages over: rows, tokens (not ignored), values
  std::string unit = "row";  // "row", "token", "value"
};

// Called on every rank, in step order; an observer that only rank 0 needs is only made there.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void on_oom(const OomEvent&) {}
  // `row` is a finished optimizer step (row.step is 0-based).
  virtual void on_step(const io::StepRow& row, const RankFigures& ranks) {
    (void)row;
    (void)ranks;
  }
  virtual void on_eval(const EvalEvent&) {}
  virtual void on_prediction(const MemoryPrediction&) {}
  virtual void on_time_probe(const TimeProbe&) {}
  // A checkpoint of the state after step `step` (1-based count of finished steps) was written.
  // A checkpoint was written after `step` steps: `bytes` in `seconds` (rank 0's; 0 elsewhere).
  virtual void on_checkpoint(std::int64_t step, std::int64_t bytes, double seconds) {
    (void)step;
    (void)bytes;
    (void)seconds;
  }
  virtual void on_message(const std::string&) {}  // notes for the user (probes, resume, skips)
  // The run ends: "completed", "failed" (with `message`) or "preempted".
  virtual void on_finish(const std::string& status, const std::string& message,
                         std::int64_t final_micro_batch) {
    (void)status;
    (void)message;
    (void)final_micro_batch;
  }
};

// Adds rows to the HDF5 run log and writes it (the whole log, atomically: io::RunLogWriter) every
// `flush_every` steps, or by default: after a retry at once, otherwise every 10 steps but at
// most once a second and at least every 5 s, and never sooner than 50 times the last write's
// duration after it (so writing a long run's log costs at most ~2% of the time); and after every
// checkpoint, so a run that dies holds a row for every step its checkpoint has. A failed write
// does not stop training: it is reported and the next one writes every row.
class RunLogObserver final : public StepObserver {
 public:
  explicit RunLogObserver(io::RunLogWriter writer, std::int64_t flush_every = 0)
      : writer_(std::move(writer)), flush_every_(flush_every) {}
  void on_oom(const OomEvent& event) override;
  void on_step(const io::StepRow& row, const RankFigures& ranks) override;
  void on_eval(const EvalEvent& event) override;
  void on_prediction(const MemoryPrediction& event) override;
  void on_time_probe(const TimeProbe& event) override;
  void on_checkpoint(std::int64_t step, std::int64_t bytes, double seconds) override;
  void on_finish(const std::string& status, const std::string& message,
                 std::int64_t final_micro_batch) override;

 private:
  void flush();
  void write(const std::string& status, const std::string& message);
  // The watchdog's last words (on_finish, on its own thread) may come while the main thread
  // writes: one writer at a time.
  std::mutex mutex_;
  io::RunLogWriter writer_;
  std::int64_t flush_every_ = 0;
  std::chrono::steady_clock::time_point last_flush_ = std::chrono::steady_clock::now();
  double last_write_seconds_ = 0;
  std::int64_t steps_since_flush_ = 0;
  std::int64_t final_micro_batch_ = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> logged_sizes_;  // per rank: (m, rows)
};

// Progress lines on rank 0's standard output: the first step, every `every` steps and the
// last; OOM decisions; evaluations; messages.
class ProgressObserver final : public StepObserver {
 public:
  ProgressObserver(std::int64_t every, std::int64_t first_step, std::int64_t total_steps);
  void on_oom(const OomEvent& event) override;
  void on_step(const io::StepRow& row, const RankFigures& ranks) override;
  void on_eval(const EvalEvent& event) override;
  void on_prediction(const MemoryPrediction& event) override;
  void on_time_probe(const TimeProbe& event) override;
  void on_message(const std::string& line) override;

 private:
  std::int64_t every_, first_step_, total_steps_;
  // Since the start: the samples (rows or documents, every rank's part of each batch: with
  // --global-batch-tokens a batch's count varies) and documents' real tokens the steps took.
  std::int64_t samples_ = 0, tokens_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace autoaccum::train
