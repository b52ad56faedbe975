// DataFeed: the readers, the batch plan, the steps, the shares and each step's split between
// ranks (rows, or documents by tokens), the bounds on micro-batch sizes, and the warning about
// slow data (sizing/data_feed.hpp; docs/data-format.md).
#include "autoaccum/train/sizing/data_feed.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "autoaccum/core/console.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/core/fingerprint.hpp"
#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/memory/memory.hpp"

namespace autoaccum::train {

DataFeed::DataFeed(const TrainOptions& options, int rank, int world)
    : options_(options), rank_(rank), world_(world) {}

void DataFeed::expand_paths() {
  paths_ = data::expand_data_paths(options_.data);
  if (!options_.val_data.empty())
    val_paths_ = data::expand_data_paths(options_.val_data, "--val-data");
}

DataFeed::Position DataFeed::position(std::int64_t global_step) const {
  const std::int64_t per_epoch = plan_->batches_per_epoch();
  const std::int64_t since = global_step - epoch_step_;
  return {epoch_ + since / per_epoch, since % per_epoch};
}

void DataFeed::resume_at(std::int64_t step, std::int64_t epoch_step, std::int64_t epoch) {
  epoch_step_ = epoch_step;
  epoch_ = epoch;
  total_steps_ = std::max(steps_wanted(), step);
}

// The steps --steps or --epochs ask for, counted from the epoch origin.
std::int64_t DataFeed::steps_wanted() const {
  if (options_.steps > 0) return options_.steps;
  const double epochs_left = options_.epochs - static_cast<double>(epoch_);
  return epoch_step_ +
         static_cast<std::int64_t>(epochs_left * static_cast<double>(plan_->batches_per_epoch()));
}

StepSplit DataFeed::split_of(std::int64_t global_step) const {
  StepSplit split;
  const Position at = position(global_step);
  split.batch = plan_->batch_rows(at.epoch, at.batch);
  if (!documents()) {
    split.offsets = balance_->offsets(global_step);
  } else {
    // --balance throughput: the schedule's shares weigh the ranks' tokens.
    const std::int64_t* lengths = reader_->schema().lengths.data() + split.batch.begin;
    split.offsets = data::token_balanced_offsets(
        lengths, split.batch.size(), world_,
        options_.balance ? balance_->shares(global_step) : std::vector<std::int64_t>{});
    for (int r = 0; r < world_; ++r) {
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
data::Batch DataFeed::read_rank_rows(std::int64_t global_step) const {
  const memory::UncountedScope staging;  // host staging, as pinned memory on a GPU
  const StepSplit split = split_of(global_step);
  const auto r = static_cast<std::size_t>(rank_);
  return reader_->read(split.batch.begin + split.offsets[r],
                       split.batch.begin + split.offsets[r + 1]);
}

// Compressed data is decompressed by the prefetch thread on the cores that train: it slows
// the steps without showing as "waiting for data". Said once, with the measured rate.
void DataFeed::warn_about_slow_data() const {
  const std::vector<std::string> compressed = reader_->compressed_datasets();
  if (compressed.empty()) return;
  const data::RowRange share = plan_->rank_rows(0, 0, 0);
  const memory::UncountedScope staging;
  const auto start = std::chrono::steady_clock::now();
  const data::Batch slab = reader_->read(share.begin, share.end);
  const double seconds = std::max(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1e-9);
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
       << reader_->paths().front() << " fast.h5 (docs/data-format.md)";
  core::write_line(stderr, line.str());
}

// The training data (and --val-data), the batch plan, the steps, the shares and the bounds of
// micro-batch sizes.
void DataFeed::open(bool root) {
  const auto& o = options_;
  reader_ = std::make_unique<data::SlabReader>(paths_, o.inputs, o.targets, true, o.ignore_index);
  if (!o.val_data.empty()) open_validation();
  make_plan();
  order_ = describe_order();
  if (root && !o.quiet) warn_about_slow_data();
  if (o.steps < 0 || o.epochs < 0) throw UsageError("--steps and --epochs must not be negative");
  total_steps_ = steps_wanted();
  if (o.dry_run) total_steps_ = std::max<std::int64_t>(total_steps_, 1);
  if (total_steps_ < 1)
    throw UsageError("nothing to do: give --steps N or --epochs E (E * batches per epoch >= 1)");
  balance_ = std::make_unique<Balance>(documents(), o.global_batch, world_,
                                       o.balance ? o.balance_every : 0);
  if (o.balance && o.micro_batch && *o.micro_batch * world_ > o.global_batch) {
    throw UsageError("--balance throughput keeps every rank at least its micro-batch, but " +
                     std::to_string(world_) + " ranks x --micro-batch " +
                     std::to_string(*o.micro_batch) + " is more than --global-batch " +
                     std::to_string(o.global_batch) +
                     ": lower --micro-batch or use --micro-batch auto");
  }
  if (documents())
    choose_token_budgets();
  else
    choose_row_sizes();
}

// --val-data: the same kind of data as --data, checked now, not in the final evaluation after
// hours of training.
void DataFeed::open_validation() {
  const auto& o = options_;
  val_reader_ =
      std::make_unique<data::SlabReader>(val_paths_, o.inputs, o.targets, true, o.ignore_index);
  const bool classification = reader_->schema().target().type == data::FieldType::kInt64;
  const auto& a = reader_->schema();
  const auto& b = val_reader_->schema();
  if (a.documents != b.documents || a.fields.size() != b.fields.size()) {
    throw InputError("--val-data '" + val_reader_->paths().front() + "' holds " +
                     (b.documents ? "documents" : "rows") + " with " +
                     std::to_string(b.fields.size()) + " field(s), but --data '" +
                     reader_->paths().front() + "' holds " + (a.documents ? "documents" : "rows") +
                     " with " + std::to_string(a.fields.size()));
  }
  for (std::size_t i = 0; i < a.fields.size(); ++i) {
    if (a.fields[i].type != b.fields[i].type || a.fields[i].row_shape != b.fields[i].row_shape) {
      throw InputError("--val-data '" + val_reader_->paths().front() + "': dataset '" +
                       b.fields[i].name + "' is " + data::to_string(b.fields[i].type) + " " +
                       data::shape_text(b.fields[i].row_shape) +
                       " per row, but the training data's is " + data::to_string(a.fields[i].type) +
                       " " + data::shape_text(a.fields[i].row_shape));
    }
  }
  if (classification && b.max_label && *b.max_label >= *a.num_classes) {
    const std::string classes = std::to_string(*a.num_classes);
    throw InputError("--val-data '" + val_reader_->paths().front() + "': dataset '" + o.targets +
                     "' has label " + std::to_string(*b.max_label) +
                     ", outside the training data's " + classes + " classes [0, " + classes + ")");
  }
}

// Which rows form each step's global batch: --global-batch rows (or documents), or documents
// in order while their tokens stay within --global-batch-tokens.
void DataFeed::make_plan() {
  const auto& o = options_;
  const auto& schema = reader_->schema();
  if (o.global_batch_tokens > 0) {
    if (!schema.documents) {
      throw UsageError("--global-batch-tokens: --data '" + reader_->paths().front() +
                       "' holds rows, not documents; use --global-batch");
    }
    plan_ = std::make_unique<data::BatchPlan>(data::BatchPlan::by_tokens(
        schema.lengths, o.global_batch_tokens, world_, data::parse_shuffle(o.shuffle), o.seed));
  } else {
    plan_ = std::make_unique<data::BatchPlan>(schema.rows, o.global_batch, world_,
                                              data::parse_shuffle(o.shuffle), o.seed);
  }
}

// Rows: micro-batch sizes count rows, from the whole share down; the document options refused.
void DataFeed::choose_row_sizes() {
  const auto& o = options_;
  if (o.micro_batch_tokens_given) {
    throw UsageError("--micro-batch-tokens: --data '" + reader_->paths().front() +
                     "' holds rows, not documents; use --micro-batch");
  }
  if (o.token_cost_by_memory) {
    throw UsageError("--token-cost memory: --data '" + reader_->paths().front() +
                     "' holds rows, not documents: every row has the same width");
  }
  if (o.micro_batch_cost_given) {
    throw UsageError("--micro-batch-cost: --data '" + reader_->paths().front() +
                     "' holds rows, not documents: rows are cut into equal slices");
  }
  sizes_.cap = plan_->max_rank_rows();
  sizes_.fixed = o.micro_batch;
}

// Document data: micro-batch sizes are budgets of padded tokens. `auto` starts at the largest
// padded size any rank's share of any batch has as one micro-batch (the whole share, as rows
// start at the whole share), and halving stops at the longest document, which must go alone.
void DataFeed::choose_token_budgets() {
  const auto& o = options_;
  const auto& schema = reader_->schema();
  const std::string data = "--data '" + reader_->paths().front() + "'";
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
  for (std::int64_t b = 0; b < plan_->batches_per_epoch(); ++b) {
    const data::RowRange batch = plan_->file_batch(b);
    const std::int64_t* first = lengths.data() + batch.begin;
    const auto offsets = data::token_balanced_offsets(first, batch.size(), world_);
    for (int r = 0; r < world_; ++r) {
      start = std::max(start, data::padded_size(std::vector<std::int64_t>(
                                  first + offsets[static_cast<std::size_t>(r)],
                                  first + offsets[static_cast<std::size_t>(r) + 1])));
    }
  }
  if (o.micro_batch_tokens) start = std::max(start, *o.micro_batch_tokens);
  sizes_.cap = start;
  sizes_.floor = schema.max_length;
  sizes_.fixed = o.micro_batch_tokens;
}

namespace {

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

// The order's options, the files and a fingerprint of the schema, the shards' rows and a few
// rows' values: what a checkpoint records so a resume reads the epoch's rows as it would have.
io::DataOrder DataFeed::describe_order() const {
  io::DataOrder d;
  d.global_batch = options_.global_batch;
  d.global_batch_tokens = options_.global_batch_tokens;
  d.shuffle = options_.shuffle;
  d.rows = reader_->schema().rows;
  Fingerprint print;
  print.add(reader_->schema().describe());
  const auto rows = reader_->shard_rows();
  for (std::size_t s = 0; s < rows.size(); ++s) {
    d.files.push_back(basename_of(reader_->paths()[s]));
    print.add(rows[s]);
  }
  // A few rows' values: the first, the last and two between (host staging, not counted).
  const memory::UncountedScope staging;
  const std::int64_t n = d.rows;
  for (const std::int64_t row : {std::int64_t{0}, n / 3, (2 * n) / 3, n - 1}) {
    const data::Batch one = reader_->read(row, row + 1);
    std::vector<at::Tensor> values;
    for (std::size_t i = 0; i < one.size(); ++i)
      values.push_back(one[i].contiguous());
    if (const data::Documents* documents = one.documents()) {
      values.push_back(documents->tokens);
      if (documents->labels.defined()) values.push_back(documents->labels);
    }
    for (const at::Tensor& t : values)
      print.add(t.data_ptr(), static_cast<std::size_t>(t.nbytes()));
  }
  d.fingerprint = print.hex();
  return d;
}

std::string DataFeed::count_text(std::int64_t size) const {
  return std::to_string(size) + (documents() ? " token" : " row") + (size == 1 ? "" : "s");
}

bool DataFeed::cut_by_time() const {
  return documents() && options_.micro_batch_cost == TrainOptions::MicroBatchCost::kAuto;
}

std::string DataFeed::cut_text() const {
  if (!documents()) return "";
  switch (options_.micro_batch_cost) {
    case TrainOptions::MicroBatchCost::kPieces:
      return "into the fewest micro-batches, then the least padding (--micro-batch-cost pieces)";
    case TrainOptions::MicroBatchCost::kAuto:
      return "by predicted time, each rank's compute fitted by the time probe "
             "(--micro-batch-cost auto)";
    case TrainOptions::MicroBatchCost::kGiven: {
      std::ostringstream text;
      text << "by predicted time (--micro-batch-cost fixed=" << options_.cost_fixed
           << ",width=" << options_.cost_width << ")";
      return text.str();
    }
  }
  return "";
}

}  // namespace autoaccum::train
