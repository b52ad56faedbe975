// TrainOptions: everything `autoaccum train` was asked to do, already validated.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autoaccum/core/drill.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/precision.hpp"
#include "autoaccum/train/step/loss_scale.hpp"

namespace autoaccum::train {

// --inject-slow rank=R,factor=F: a drill that makes rank R take F times as long per row (it
// sleeps F - 1 times each micro-batch's compute time), so balance is testable on equal cores.
struct SlowInjection {
  int rank = 0;
  double factor = 1.0;
};
std::vector<SlowInjection> parse_slow_injections(const std::string& text);

struct TrainOptions {
  std::vector<std::string> data;      // files or globs
  std::vector<std::string> val_data;  // files or globs; empty: no evaluation
  std::vector<std::string> inputs{"x"};
  std::string targets = "y";

  std::string model = "mlp";  // mlp | cnn
  std::vector<std::int64_t> hidden{512, 512};
  std::string model_file;            // TorchScript; overrides model
  std::string loss = "auto";         // auto | cross-entropy | mse | bce
  std::int64_t ignore_index = -100;  // cross-entropy: labels skipped (padding)

  std::int64_t global_batch = 256;
  // Document data: --global-batch-tokens N, batches of whole documents up to N tokens (0: off).
  std::int64_t global_batch_tokens = 0;
  std::optional<std::int64_t> micro_batch;  // nullopt: auto
  bool micro_batch_given = false;           // --micro-batch on the command line
  // Document data: --micro-batch-tokens N, padded tokens per micro-batch (nullopt: auto).
  std::optional<std::int64_t> micro_batch_tokens;
  bool micro_batch_tokens_given = false;
  bool refine_micro_batch = false;  // --micro-batch-search refine (and predict, after a miss)
  // Document data, automatic budgets: --token-cost memory spends a budget by the memory model's
  // cost of a token at each width (data::WidthCost; a third probe point of shorter documents
  // measures it); false (flat, the default): every padded token counts alike.
  bool token_cost_by_memory = false;
  // Document data: how a rank's documents are cut under its budget (--micro-batch-cost).
  // kAuto (the default): the least predicted time, each rank's cost per micro-batch fitted by
  // the time probe before the first step (train::TimeFit, data::PieceCost). kPieces: the fewest
  // micro-batches, then the least padding (the same cuts on every fresh start). kGiven: the least
  // predicted time under `cost_fixed` padded tokens per micro-batch and `cost_width` per padded
  // token per unit of width, the same on every rank (reproducible across fresh starts).
  enum class MicroBatchCost { kPieces, kAuto, kGiven };
  MicroBatchCost micro_batch_cost = MicroBatchCost::kAuto;
  bool micro_batch_cost_given = false;  // named on the command line (rows refuse it)
  double cost_fixed = 0;
  double cost_width = 0;
  // --micro-batch-search predict (the default): probe memory before the first step and start at
  // the largest size the memory model predicts to fit (train/memory_model.hpp).
  bool predict_micro_batch = true;
  // --memory-margin: the share of the room above the fixed state kept free by predictions.
  double memory_margin = 0.05;
  // --micro-batch-regrow N: N clean steps after an out-of-memory lowered an automatic size, try
  // the size before once more (0: never). -1: the default, 100 with predict, 0 with halve and
  // refine (the searches as they were).
  std::int64_t micro_batch_regrow = -1;
  // --dry-run: set up, measure two micro-batches per rank, print the micro-batch each rank is
  // predicted to hold and the largest global batch without accumulation, then exit (no
  // optimizer step, no run log or checkpoint written).
  bool dry_run = false;
  std::int64_t steps = 0;  // 0: from epochs
  double epochs = 0;
  std::string shuffle = "batch";

  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  std::int64_t warmup_steps = 0;
  std::string schedule = "constant";  // constant | cosine
  double clip_grad_norm = 0.0;        // 0: off
  std::string on_nonfinite = "stop";  // stop | skip
  // --precision: the forward and loss under autocast in bf16 or fp16; parameters, optimizer
  // state and the accumulated gradients stay fp32.
  Precision precision = Precision::kFp32;
  std::vector<OverflowInjection> inject_overflow;  // --inject-overflow drills (loss scaling)

  std::uint64_t seed = 0;
  int threads = 0;  // 0: cores on the node / ranks on the node
  std::string device = "cpu";
  std::string backend = "auto";
  std::int64_t memory_limit = 0;  // bytes per rank; 0: none
  // --memory-limit A,B,...: rank i gets item i % size (mixed nodes, tests); when given, the
  // trainer sets memory_limit to this rank's item.
  std::vector<std::int64_t> memory_limits;
  // --micro-batch-scope: false (global): any rank's out-of-memory halves every rank's
  // micro-batch; true (rank): only the ranks that ran out halve theirs.
  bool micro_batch_per_rank = false;
  // --balance throughput: every balance_every steps the ranks re-split the global batch in
  // proportion to their measured rows per second.
  bool balance = false;
  std::int64_t balance_every = 50;
  std::vector<SlowInjection> inject_slow;
  std::vector<memory::OomInjection> inject_oom;    // --inject-oom drills
  std::vector<core::StallInjection> inject_stall;  // --inject-stall drills (the watchdog)
  // --overlap: all-reduce the gradients in buckets during the last backward pass of a step
  // (train/bucketed_reduce.hpp). auto: on when the ranks span more than one node, on the CPU.
  std::string overlap = "auto";  // auto | on | off
  // --shard optimizer: each rank keeps optimizer state for, and updates, a 1/W slice of the
  // parameters; the gradients are reduce-scattered and the parameters all-gathered
  // (train/reducer.hpp). gradients: also only its slice of the accumulated gradients, every
  // micro-batch's reduced in buckets during backward. none: every rank holds everything.
  std::string shard = "none";  // none | optimizer | gradients
  double bucket_mib = 1;       // --bucket-mib: the size of a bucket (measured: docs/benchmarks.md)
  // --collective-timeout: the deadline of every collective (comm/watchdog.hpp); 0: none.
  double collective_timeout_seconds = 600;

  std::string run_log;
  std::string checkpoint;
  std::int64_t checkpoint_every = 0;
  std::int64_t keep_checkpoints = 2;  // the newest and the older ones kept beside it
  bool resume = false;
  // --resume-reshape: a changed data order (global batch, shuffle, seed) starts at the
  // checkpoint's epoch boundary; refused in the middle of an epoch.
  bool resume_reshape = false;
  std::int64_t eval_every = 0;
  std::int64_t log_every = 10;
  // Run log flushes: every N steps; 0: automatic (see RunLogObserver).
  std::int64_t log_flush_every = 0;
  std::int64_t eval_micro_batch = 0;  // 0: auto

  std::string command_line;
  bool quiet = false;  // no progress output (tests)
};

}  // namespace autoaccum::train
