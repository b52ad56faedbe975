// What the step reports, and to whom: the observer interface that run/ implements (run log rows,
// progress lines), every rank's figures at a finished step, and the Reporter that holds the
// run's observers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autoaccum/io/run_log.hpp"
#include "autoaccum/train/model/evaluation.hpp"
#include "autoaccum/train/sizing/events.hpp"

namespace autoaccum::train {

// Every rank's figures at a finished step, indexed by rank.
struct RankFigures {
  std::vector<std::int64_t> peak_bytes;     // the largest peak each has reported so far
  std::vector<std::int64_t> micro_batches;  // the size each used in the step
  std::vector<std::int64_t> rows;           // its part of the global batch
  std::vector<std::int64_t> accumulation;   // how many micro-batches each ran in the step
  bool documents = false;                   // document data: sizes are token budgets
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

// The run's observers, in the order run/ opened them, and what is said to them. Every rank has
// one; an observer that only rank 0 needs is only made there.
class Reporter {
 public:
  void add(std::unique_ptr<StepObserver> observer) { observers_.push_back(std::move(observer)); }
  template <class Fn>
  void notify(Fn&& fn) {
    for (auto& observer : observers_)
      fn(*observer);
  }
  void say(const std::string& line) {
    notify([&](StepObserver& o) { o.on_message(line); });
  }
  // A note from before the observers exist (set-up, resume): said as "note: ..." by
  // say_notes(), after the banner.
  void note(std::string line) { notes_.push_back(std::move(line)); }
  void say_notes() {
    for (const auto& line : notes_)
      say("note: " + line);
    notes_.clear();
  }
  // The run's end, told once: the watchdog's last words may tell it from their own thread while
  // the main thread waits in a collective.
  void finish(const std::string& status, const std::string& message,
              std::int64_t final_micro_batch) {
    if (finished_.exchange(true)) return;
    notify([&](StepObserver& o) { o.on_finish(status, message, final_micro_batch); });
  }
  // An end with nothing to tell (--dry-run): later ends are not told either.
  void close() { finished_.store(true); }

 private:
  std::vector<std::unique_ptr<StepObserver>> observers_;
  std::vector<std::string> notes_;
  std::atomic<bool> finished_{false};
};

}  // namespace autoaccum::train
