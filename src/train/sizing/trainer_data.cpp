// The trainer's data: the readers, the batch plan and each step's split between ranks (rows,
// or documents by tokens), the token budgets' start, and the warning about slow data
// (docs/design.md, "Inside train"; docs/data-format.md).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/console.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/objective.hpp"
#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"

#include "../trainer_state.hpp"

namespace autoaccum::train {

Trainer::State::Position Trainer::State::position(std::int64_t global_step) const {
  const std::int64_t per_epoch = plan->batches_per_epoch();
  const std::int64_t since = global_step - epoch_origin_step;
  return {epoch_origin + since / per_epoch, since % per_epoch};
}

std::int64_t Trainer::State::steps_wanted() const {
  if (options.steps > 0) return options.steps;
  const double epochs_left = options.epochs - static_cast<double>(epoch_origin);
  return epoch_origin_step +
         static_cast<std::int64_t>(epochs_left * static_cast<double>(plan->batches_per_epoch()));
}

Trainer::State::StepSplit Trainer::State::split_of(std::int64_t global_step) const {
  StepSplit split;
  const Position at = position(global_step);
  split.batch = plan->batch_rows(at.epoch, at.batch);
  if (!documents()) {
    split.offsets = balance->offsets(global_step);
  } else {
    // --balance throughput: the schedule's shares weigh the ranks' tokens.
    const std::int64_t* lengths = reader->schema().lengths.data() + split.batch.begin;
    split.offsets = data::token_balanced_offsets(
        lengths, split.batch.size(), world,
        options.balance ? balance->shares(global_step) : std::vector<std::int64_t>{});
    for (int r = 0; r < world; ++r) {
      split.tokens.push_back(std::accumulate(
          lengths + split.offsets[static_cast<std::size_t>(r)],
          lengths + split.offsets[static_cast<std::size_t>(r) + 1], std::int64_t{0}));
    }
  }
  for (std::size_t r = 0; r + 1 < split.offsets.size(); ++r)
    split.rows.push_back(split.offsets[r + 1] - split.offsets[r]);
  return split;
}

// This rank's rows of step `global_step`: its part of that step's global batch under the split
// the schedule gives for the step (even, or balanced by speed).
data::Batch Trainer::State::read_rank_rows(std::int64_t global_step) const {
  const memory::UncountedScope staging;  // host staging, as pinned memory on a GPU
  const StepSplit split = split_of(global_step);
  const auto r = static_cast<std::size_t>(rank);
  return reader->read(split.batch.begin + split.offsets[r],
                      split.batch.begin + split.offsets[r + 1]);
}

// Compressed data is decompressed by the prefetch thread on the cores that train: it slows
// the steps without showing as "waiting for data". Said once, with the measured rate.
void Trainer::State::warn_about_slow_data() const {
  const std::vector<std::string> compressed = reader->compressed_datasets();
  if (compressed.empty()) return;
  const data::RowRange share = plan->rank_rows(0, 0, 0);
  const memory::UncountedScope staging;
  const auto start = Clock::now();
  const data::Batch slab = reader->read(share.begin, share.end);
  const double seconds = std::max(seconds_since(start), 1e-9);
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < slab.size(); ++i)
    bytes += static_cast<std::int64_t>(slab[i].nbytes());
  if (const data::Documents* documents = slab.documents())
    bytes += static_cast<std::int64_t>(documents->tokens.nbytes());
  std::ostringstream line;
  line << "autoaccum: warning: --data: " << compressed.front();
  if (compressed.size() > 1) line << " and " << compressed.size() - 1 << " more";
  line << " stored compressed: reading a rank's share of a batch (" << share.size() << " rows, "
       << memory::format_bytes(bytes) << ") took " << std::fixed << std::setprecision(1)
       << seconds * 1000 << " ms (" << std::setprecision(0)
       << static_cast<double>(share.size()) / seconds << " rows/s), decompressed on the cores "
       << "that train; rewrite it uncompressed and contiguous, e.g. h5repack -f NONE -l CONTI "
       << reader->paths().front() << " fast.h5 (docs/data-format.md)";
  core::write_line(stderr, line.str());
}

// The training data (and --val-data), the batch plan, the steps, the shares and the micro-batch
// sizes: collective, every rank agreeing on any error.
void Trainer::State::open_data() {
  const auto& o = options;
  comm::collectively(comm, [&] {
    reader =
        std::make_unique<data::SlabReader>(data_paths, o.inputs, o.targets, true, o.ignore_index);
    const auto& schema = reader->schema();
    const bool classification = schema.target().type == data::FieldType::kInt64;
    objective.emplace(Objective::choose(o.loss, schema.target(),
                                        classification ? *schema.num_classes : 0, o.ignore_index));
    if (!o.val_data.empty()) open_validation();
    make_plan();
    data_order = describe_data_order();
    if (root && !o.quiet) warn_about_slow_data();
    if (o.steps < 0 || o.epochs < 0) throw UsageError("--steps and --epochs must not be negative");
    total_steps = steps_wanted();
    if (o.dry_run) total_steps = std::max<std::int64_t>(total_steps, 1);
    if (total_steps < 1)
      throw UsageError("nothing to do: give --steps N or --epochs E (E * batches per epoch >= 1)");
    balance = std::make_unique<Balance>(schema.documents, o.global_batch, world,
                                        o.balance ? o.balance_every : 0);
    if (o.balance && o.micro_batch && *o.micro_batch * world > o.global_batch) {
      throw UsageError("--balance throughput keeps every rank at least its micro-batch, but " +
                       std::to_string(world) + " ranks x --micro-batch " +
                       std::to_string(*o.micro_batch) + " is more than --global-batch " +
                       std::to_string(o.global_batch) +
                       ": lower --micro-batch or use --micro-batch auto");
    }
    if (schema.documents)
      choose_token_budgets();
    else
      choose_row_sizes();
  });
}

// --val-data: the same kind of data as --data, checked now, not in the final evaluation after
// hours of training.
void Trainer::State::open_validation() {
  const auto& o = options;
  val_reader =
      std::make_unique<data::SlabReader>(val_data_paths, o.inputs, o.targets, true, o.ignore_index);
  const bool classification = reader->schema().target().type == data::FieldType::kInt64;
  const auto& a = reader->schema();
  const auto& b = val_reader->schema();
  if (a.documents != b.documents || a.fields.size() != b.fields.size()) {
    throw InputError("--val-data '" + val_reader->paths().front() + "' holds " +
                     (b.documents ? "documents" : "rows") + " with " +
                     std::to_string(b.fields.size()) + " field(s), but --data '" +
                     reader->paths().front() + "' holds " + (a.documents ? "documents" : "rows") +
                     " with " + std::to_string(a.fields.size()));
  }
  for (std::size_t i = 0; i < a.fields.size(); ++i) {
    if (a.fields[i].type != b.fields[i].type || a.fields[i].row_shape != b.fields[i].row_shape) {
      throw InputError("--val-data '" + val_reader->paths().front() + "': dataset '" +
                       b.fields[i].name + "' is " + data::to_string(b.fields[i].type) + " " +
                       shape_text(b.fields[i].row_shape) + " per row, but the training data's is " +
                       data::to_string(a.fields[i].type) + " " + shape_text(a.fields[i].row_shape));
    }
  }
  if (classification && b.max_label && *b.max_label >= objective->classes()) {
    throw InputError("--val-data '" + val_reader->paths().front() + "': dataset '" + o.targets +
                     "' has label " + std::to_string(*b.max_label) +
                     ", outside the training data's " + std::to_string(objective->classes()) +
                     " classes [0, " + std::to_string(objective->classes()) + ")");
  }
}

// Which rows form each step's global batch: --global-batch rows (or documents), or documents
// in order while their tokens stay within --global-batch-tokens.
void Trainer::State::make_plan() {
  const auto& o = options;
  const auto& schema = reader->schema();
  if (o.global_batch_tokens > 0) {
    if (!schema.documents) {
      throw UsageError("--global-batch-tokens: --data '" + reader->paths().front() +
                       "' holds rows, not documents; use --global-batch");
    }
    plan = std::make_unique<data::BatchPlan>(data::BatchPlan::by_tokens(
        schema.lengths, o.global_batch_tokens, world, data::parse_shuffle(o.shuffle), o.seed));
  } else {
    plan = std::make_unique<data::BatchPlan>(schema.rows, o.global_batch, world,
                                             data::parse_shuffle(o.shuffle), o.seed);
  }
}

// Rows: micro-batch sizes count rows, from the whole share down; the document options refused.
void Trainer::State::choose_row_sizes() {
  const auto& o = options;
  if (o.micro_batch_tokens_given) {
    throw UsageError("--micro-batch-tokens: --data '" + reader->paths().front() +
                     "' holds rows, not documents; use --micro-batch");
  }
  if (o.token_cost_by_memory) {
    throw UsageError("--token-cost memory: --data '" + reader->paths().front() +
                     "' holds rows, not documents: every row has the same width");
  }
  if (o.micro_batch_cost != TrainOptions::MicroBatchCost::kPieces) {
    throw UsageError("--micro-batch-cost: --data '" + reader->paths().front() +
                     "' holds rows, not documents: rows are cut into equal slices");
  }
  size_cap = plan->max_rank_rows();
  fixed_size = o.micro_batch;
  make_micro_batches({});
}

// Document data: micro-batch sizes are budgets of padded tokens. `auto` starts at the largest
// padded size any rank's share of any batch has as one micro-batch (the whole share, as rows
// start at the whole share), and halving stops at the longest document, which must go alone.
void Trainer::State::choose_token_budgets() {
  const auto& o = options;
  const auto& schema = reader->schema();
  const std::string data = "--data '" + reader->paths().front() + "'";
  if (o.micro_batch_given) {
    throw UsageError("--micro-batch counts rows, but " + data +
                     " holds documents: use --micro-batch-tokens auto|N (padded tokens per "
                     "micro-batch)");
  }
  if (o.model_file.empty()) {
    throw UsageError(data +
                     " holds documents: train them with --model-file (a TorchScript model "
                     "taking token ids [m, L]); --model " +
                     o.model + " takes fixed rows");
  }
  const auto& lengths = schema.lengths;
  const auto longest = std::max_element(lengths.begin(), lengths.end()) - lengths.begin();
  if (o.micro_batch_tokens && o.token_cost_by_memory) {
    throw UsageError("--token-cost memory spends an automatic budget; --micro-batch-tokens " +
                     std::to_string(*o.micro_batch_tokens) +
                     " is fixed: use --micro-batch-tokens auto, or --token-cost flat");
  }
  if (o.micro_batch_tokens && *o.micro_batch_tokens < schema.max_length) {
    throw UsageError("--micro-batch-tokens " + std::to_string(*o.micro_batch_tokens) +
                     " cannot hold document " + std::to_string(longest) + " of " + data + " (" +
                     std::to_string(schema.max_length) +
                     " tokens) even alone; raise it, or split long documents with autoaccum "
                     "import text --documents --max-length N");
  }
  std::int64_t start = 1;
  for (std::int64_t b = 0; b < plan->batches_per_epoch(); ++b) {
    const data::RowRange batch = plan->file_batch(b);
    const std::int64_t* first = lengths.data() + batch.begin;
    const auto offsets = data::token_balanced_offsets(first, batch.size(), world);
    for (int r = 0; r < world; ++r) {
      start = std::max(start, data::padded_size(std::vector<std::int64_t>(
                                  first + offsets[static_cast<std::size_t>(r)],
                                  first + offsets[static_cast<std::size_t>(r) + 1])));
    }
  }
  if (o.micro_batch_tokens) start = std::max(start, *o.micro_batch_tokens);
  size_cap = start;
  size_floor = schema.max_length;
  fixed_size = o.micro_batch_tokens;
  make_micro_batches({});
}

std::string Trainer::State::micro_batch_cost_text() const {
  if (!documents()) return "";
  switch (options.micro_batch_cost) {
    case TrainOptions::MicroBatchCost::kPieces:
      return "into the fewest micro-batches, then the least padding (--micro-batch-cost pieces)";
    case TrainOptions::MicroBatchCost::kAuto:
      return "by predicted time, each rank's compute fitted by the time probe "
             "(--micro-batch-cost auto)";
    case TrainOptions::MicroBatchCost::kGiven: {
      std::ostringstream text;
      text << "by predicted time (--micro-batch-cost fixed=" << options.cost_fixed
           << ",width=" << options.cost_width << ")";
      return text.str();
    }
  }
  return "";
}

}  // namespace autoaccum::train
