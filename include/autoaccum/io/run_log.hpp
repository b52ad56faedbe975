// The HDF5 run log: what micro-batch each step used, every OOM, evaluations, per-rank figures.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace autoaccum::io {

inline constexpr const char* kRunLogFormat = "autoaccum.runlog";
// 2: the `resumes` group; the file is rewritten whole at each flush.
// 3: the `rank_sizes` group (every rank's micro-batch and rows).
// 8: `resumes/global_batch` and `resumes/reshaped` (--resume-reshape).
// 9: the `checkpoints` group (every checkpoint written: its step, bytes and seconds).
// 10: `steps/accumulation_max` and `steps/accumulation_max_rank` (every rank's micro-batches).
// 11: `resumes/skipped_checkpoints`, root attributes `resume_checkpoints` and `resume_skipped`.
// 14: the `time_model` group (--micro-batch-cost auto), replacing 13's `memory_model/cost_fixed`
//     and `seconds_per_token`; `steps/compute_seconds` and `steps/predicted_compute_seconds`.
// 15: `shard` "gradients"; `fixed_bytes_counted_optimizer` and `fixed_bytes_counted_gradients`.
inline constexpr std::int64_t kRunLogSchemaVersion = 15;

struct StepRow {
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  std::int64_t micro_batch = 0;
  std::int64_t accumulation = 0;  // micro-batches on rank 0
  // The most micro-batches any rank ran in the step, and the lowest rank that ran that many
  // (they differ from rank 0's under --micro-batch-scope rank, unequal shares, and documents).
  std::int64_t accumulation_max = 0;
  std::int64_t accumulation_max_rank = 0;
  double loss = 0;
  double lr = 0;
  double loss_scale = 1;  // --precision fp16: the loss scale the step ran at; 1 otherwise
  double step_seconds = 0;
  double samples_per_second = 0;
  std::int64_t oom_retries = 0;
  double data_wait_seconds = 0;  // time rank 0 waited for the prefetcher in this step
  double data_cpu_seconds = 0;   // CPU time rank 0's prefetch thread spent reading its slab
  std::int64_t peak_bytes = 0;   // the largest peak over the ranks, so far
  std::int64_t skipped = 0;      // 1: non-finite loss or gradient, no update (--on-nonfinite skip)
  std::int64_t live_bytes = 0;   // rank 0's live tensor bytes after the step
  double allreduce_seconds = 0;  // rank 0's time in the step's gradient all-reduce(s)
  double retry_seconds = 0;      // time spent in this step's attempts that ran out of memory
  // Document data: the global batch's real tokens, and the tokens the model processed with
  // padding (every rank's micro-batches, rows x longest); 0 for row data.
  std::int64_t tokens = 0;
  std::int64_t padded_tokens = 0;
  // Rank 0's time computing its micro-batches in the attempt that succeeded, and what its time
  // fit predicted for them (--micro-batch-cost auto; 0 without a fit).
  double compute_seconds = 0;
  double predicted_compute_seconds = 0;
};

// Rank `rank` used micro-batch `micro_batch` on `rows` rows of the global batch from step `step`
// on: a row at the first step, whenever either changes, and at a resume. A rank's sizes at step
// s are those of its last row at or before s (per-rank micro-batches differ under
// --micro-batch-scope rank).
struct RankSizeRow {
  std::int64_t step = 0;
  std::int64_t rank = 0;
  std::int64_t micro_batch = 0;
  std::int64_t rows = 0;
};

struct OomRow {
  std::int64_t step = 0;
  std::int64_t rank = 0;
  std::int64_t micro_batch = 0;       // the size that did not fit
  std::int64_t next_micro_batch = 0;  // the size tried next (0: none, the run stopped)
};

// The memory model at the probe (--micro-batch-search predict): rank `rank` measured fixed +
// per-unit x size (+ per-square x rows x width^2 for documents) bytes, predicted `predicted`
// (rows, or tokens for documents) under its limit with `margin` of the room kept, and started at
// `micro_batch`. Fit columns are -1 when no model could be fitted (one size measured).
struct MemoryModelRow {
  std::int64_t step = 0;
  std::int64_t rank = 0;
  std::int64_t limit_bytes = 0;
  double fixed_bytes = 0;
  double bytes_per_unit = 0;
  double bytes_per_square = 0;
  double margin = 0;
  std::int64_t predicted = 0;
  std::int64_t micro_batch = 0;
  std::int64_t probe_attempts = 0;
  double probe_seconds = 0;
};

// Documents, --micro-batch-cost auto: rank `rank`'s compute time per micro-batch, fitted by the
// time probe before step `step` as fixed_seconds + seconds_per_token x padded tokens +
// seconds_per_square x rows x width^2 (-1 in all three: no fit, the fewest pieces), the same
// as the planner weighs it (`cost_fixed` padded tokens per micro-batch, each padded token
// 1 + `cost_width` x its width), the budget it cut with, the fit's largest error relative to a
// timed piece, the compute per step it predicts over the first steps' shares at that budget and
// at half of it (-1: none), and the probe's attempts and seconds.
struct TimeModelRow {
  std::int64_t step = 0;
  std::int64_t rank = 0;
  double fixed_seconds = -1;
  double seconds_per_token = -1;
  double seconds_per_square = -1;
  double cost_fixed = -1;
  double cost_width = -1;
  std::int64_t micro_batch = 0;
  double fit_error = -1;
  double predicted_step_seconds = -1;
  double half_budget_step_seconds = -1;
  std::int64_t probe_attempts = 0;
  double probe_seconds = 0;
};

struct EvalRow {
  std::int64_t step = 0;
  double loss = 0;
  double accuracy = 0;  // NaN for regression
};

// A checkpoint written after `step` steps: its size and how long rank 0 took to write it
// (serializing, writing, fsync and renames), while the other ranks waited.
struct CheckpointRow {
  std::int64_t step = 0;
  std::int64_t bytes = 0;
  double seconds = 0;
};

// A resumed run continued the log at `step`, dropping the rows the previous run had logged at or
// after it (steps done after its last checkpoint, computed again now).
struct ResumeRow {
  std::int64_t step = 0;
  std::int64_t dropped_steps = 0;
  std::int64_t world_size = 0;  // ranks of the resumed run (schema 3; 0 in older logs)
  // The resumed run's --global-batch (or --global-batch-tokens) and whether --resume-reshape
  // changed the data order there (schema 8; 0 in older logs).
  std::int64_t global_batch = 0;
  std::int64_t reshaped = 0;
  // Newer checkpoints passed over because they did not verify or read whole (schema 11).
  std::int64_t skipped_checkpoints = 0;
  // Not columns: the file resumed from and why newer ones were skipped ("" when none), kept as
  // the root attributes `resume_checkpoints` and `resume_skipped`, an entry per resume.
  std::string checkpoint;
  std::string skipped;
};

struct RunLogHeader {
  std::int64_t world_size = 1;
  std::int64_t global_batch = 0;
  std::string micro_batch_mode;  // "auto" or "fixed"
  std::string command_line;
  std::string started_at;                                 // ISO 8601 UTC
  std::vector<std::string> hostnames;                     // one per rank
  std::vector<std::pair<std::string, std::string>> text;  // more root attributes
  std::vector<std::pair<std::string, double>> numbers;    // more root attributes
};

// Writes the run log on rank 0. The writer keeps every row; each flush writes the whole log to a
// temporary file (made in memory, written in one piece) and renames it onto the path. A reader
// (h5py, h5dump, `autoaccum log`) therefore always sees a complete log of whole rows, as of the
// last flush, after any kill; it needs no SWMR or lock settings and never blocks the writer; a
// failed flush (a full disk) changes nothing on disk and the next one writes every row once.
class RunLogWriter {
 public:
  using Attribute = std::variant<std::int64_t, double, std::string, std::vector<std::string>>;

  // A new log with status "running", written at once.
  static RunLogWriter create(const std::string& path, const RunLogHeader& header);
  // An existing log to continue (a run resumed at `resume_step`): checks its format, keeps its
  // attributes and rows but drops those logged at or after `resume_step`, records the resume in
  // the `resumes` group, and writes it back with status "running". `hostnames` are the resumed
  // run's ranks: on another number of ranks they replace the `ranks` group (peaks start again)
  // and `world_size`. `command_line` (the resumed run's) is appended to the root attribute
  // `resume_command_lines`, one entry per row of `resumes`.
  // `resumed` holds the resumed run's global batch and whether it reshaped the data order.
  static RunLogWriter append(const std::string& path, std::int64_t resume_step,
                             const std::vector<std::string>& hostnames = {},
                             const std::string& command_line = "", const ResumeRow& resumed = {});

  const std::string& path() const noexcept { return path_; }
  void add(const StepRow& row) { steps_.push_back(row); }
  void add(const OomRow& row) { ooms_.push_back(row); }
  void add(const EvalRow& row) { evals_.push_back(row); }
  void add(const CheckpointRow& row) { checkpoints_.push_back(row); }
  void add(const RankSizeRow& row) { rank_sizes_.push_back(row); }
  void add(const MemoryModelRow& row) { memory_models_.push_back(row); }
  void add(const TimeModelRow& row) { time_models_.push_back(row); }
  void set_peak_bytes(std::vector<std::int64_t> per_rank) { peak_bytes_ = std::move(per_rank); }
  void set_final_micro_batch(std::int64_t m) { final_micro_batch_ = m; }
  std::size_t rows() const noexcept { return steps_.size() + ooms_.size() + evals_.size(); }

  void flush();
  // Flushes and sets status: "completed", "failed" (with `message` as attribute `error`), or
  // "preempted".
  void finish(const std::string& status, const std::string& message = "");

 private:
  explicit RunLogWriter(std::string path) : path_(std::move(path)) {}
  void set(const std::string& name, Attribute value);
  void write(const std::string& status, const std::string& message);

  std::string path_;
  std::vector<std::pair<std::string, Attribute>> attributes_;  // in the order first set
  std::vector<std::string> hostnames_;
  std::vector<StepRow> steps_;
  std::vector<OomRow> ooms_;
  std::vector<EvalRow> evals_;
  std::vector<CheckpointRow> checkpoints_;
  std::vector<ResumeRow> resumes_;
  std::vector<RankSizeRow> rank_sizes_;
  std::vector<MemoryModelRow> memory_models_;
  std::vector<TimeModelRow> time_models_;
  std::vector<std::int64_t> peak_bytes_;
  std::int64_t final_micro_batch_ = 0;
};

// A run log read back: root attributes as text, and each group's columns as numbers.
struct RunLogData {
  std::string path;
  std::map<std::string, std::string> attributes;
  struct Column {
    std::string name;
    bool integer = false;
    std::vector<double> values;
  };
  // group -> columns in schema order ("steps", "oom", "eval", "ranks", "resumes",
  // "rank_sizes", "memory_model", "time_model", "checkpoints")
  std::map<std::string, std::vector<Column>> groups;
  std::vector<std::string> hostnames;
  const Column* column(const std::string& group, const std::string& name) const;
  std::string attribute(const std::string& name, const std::string& fallback = "") const;
  // A root attribute of strings (one string: a list of one), each entry whole; empty if none.
  std::map<std::string, std::vector<std::string>> string_lists;
  std::vector<std::string> attribute_list(const std::string& name) const;
};

// Reads a run log; InputError names the file when it is not one.
RunLogData read_run_log(const std::string& path);

// The column names of each group, in order (the schema in docs/run-log.md).
const std::vector<std::pair<std::string, std::vector<std::string>>>& run_log_schema();

// Current UTC time as ISO 8601 ("2026-11-29T15:04:05Z").
std::string utc_now();

}  // namespace autoaccum::io
