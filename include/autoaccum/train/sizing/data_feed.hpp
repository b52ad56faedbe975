// DataFeed: the training data as the step reads it: the readers (--data, --val-data), the
// batch plan, the steps the run takes, every rank's share of each batch (Balance) and the split
// of each step between the ranks, and the bounds the data sets on micro-batch sizes (rows, or
// token budgets for documents). Built once by set-up; the step loop and the prefetch thread read
// it (docs/design.md, "Inside train"; docs/data-format.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/train/options.hpp"
#include "autoaccum/train/sizing/balance.hpp"

namespace autoaccum::train {

// What the data allows a micro-batch to be: the largest size any rank's share needs (the
// automatic start and cap), the floor halving stops at (the longest document, which must go
// alone; 1 row) and the size the user fixed, if any.
struct SizeBounds {
  std::int64_t cap = 1, floor = 1;
  std::optional<std::int64_t> fixed;
};

// How step `global_step`'s global batch is split: rank r's rows are [batch.begin + offsets[r],
// batch.begin + offsets[r + 1]) (the shares for rows, near-equal or --balance-weighted tokens for
// documents); every rank can compute every rank's, since the lengths and shares are known
// everywhere.
struct StepSplit {
  data::RowRange batch;
  std::vector<std::int64_t> offsets;  // [world + 1], into the batch
  std::vector<std::int64_t> rows;     // each rank's rows
  std::vector<std::int64_t> tokens;   // document data: each rank's tokens; empty for rows
};

class DataFeed {
 public:
  DataFeed(const TrainOptions& options, int rank, int world);

  // --data's and --val-data's globs expanded (set-up checks its outputs against them first).
  void expand_paths();
  const std::vector<std::string>& paths() const { return paths_; }
  const std::vector<std::string>& validation_paths() const { return val_paths_; }
  // Opens the readers and makes the plan, the steps, the shares and the size bounds; throws
  // UsageError or InputError naming the option and file (the caller agrees collectively).
  // `root` warns once about compressed data.
  void open(bool root);

  bool documents() const { return reader_->schema().documents; }
  data::SlabReader& reader() const { return *reader_; }
  data::SlabReader* validation() const { return val_reader_.get(); }
  const data::BatchPlan& plan() const { return *plan_; }
  // What decides the rows of each step (checked on --resume, written in checkpoints).
  const io::DataOrder& order() const { return order_; }
  const SizeBounds& sizes() const { return sizes_; }
  Balance& balance() { return *balance_; }
  const Balance& balance() const { return *balance_; }

  std::int64_t total_steps() const { return total_steps_; }
  struct Position {
    std::int64_t epoch, batch;  // the epoch and the batch within it
  };
  Position position(std::int64_t global_step) const;
  // Resumed at `step` of a checkpoint whose epoch `epoch` began at step `epoch_step` (a
  // reshaped run's is no multiple of the batches per epoch): epochs count from there, and the
  // run takes at least up to `step`.
  void resume_at(std::int64_t step, std::int64_t epoch_step, std::int64_t epoch);
  bool reshaped() const { return reshaped_; }  // --resume-reshape changed the order
  void set_reshaped() { reshaped_ = true; }

  StepSplit split_of(std::int64_t global_step) const;
  // This rank's rows of step `global_step` (host staging, not counted as the model's memory).
  data::Batch read_rank_rows(std::int64_t global_step) const;

  // A micro-batch size in its unit: "1 row", "64 rows", "512 tokens".
  std::string count_text(std::int64_t size) const;
  // Documents cut by predicted time (--micro-batch-cost auto, the default for documents): the
  // time probe runs before the first step and each attempt's compute is timed.
  bool cut_by_time() const;
  // How documents are cut, for the banner and the run log; rows: "".
  std::string cut_text() const;

 private:
  void open_validation();
  void make_plan();
  io::DataOrder describe_order() const;
  void warn_about_slow_data() const;
  std::int64_t steps_wanted() const;
  void choose_row_sizes();
  void choose_token_budgets();

  const TrainOptions& options_;
  int rank_, world_;
  std::vector<std::string> paths_, val_paths_;
  std::unique_ptr<data::SlabReader> reader_, val_reader_;
  std::unique_ptr<data::BatchPlan> plan_;
  io::DataOrder order_;
  SizeBounds sizes_;
  std::unique_ptr<Balance> balance_;
  std::int64_t total_steps_ = 0;
  // Step `epoch_step_` starts epoch `epoch_` (0 and 0 unless resumed).
  std::int64_t epoch_step_ = 0, epoch_ = 0;
  bool reshaped_ = false;
};

}  // namespace autoaccum::train
