// Observers: what hangs off the step loop without living in it (run log rows, progress lines);
// the interface they implement is the step's (step/reporter.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/io/run_log.hpp"
#include "autoaccum/train/step/reporter.hpp"

namespace autoaccum::train {

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
