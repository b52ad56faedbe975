// autoaccum train: options, validation with one-line errors, and the trainer.
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/factory.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/trainer.hpp"
#include "commands.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {
namespace {

// `data = a.h5 b.h5` in a config file arrives as one value: paths are separated by spaces there
// as on the command line (repeating the key works too).
std::vector<std::string> split_paths(const std::vector<std::string>& values) {
  std::vector<std::string> paths;
  for (const auto& value : values) {
    std::istringstream words(value);
    for (std::string path; words >> path;)
      paths.push_back(path);
  }
  return paths;
}

// The whole of `text` as an integer >= 1, or nothing.
std::optional<std::int64_t> positive_integer(const std::string& text) {
  try {
    std::size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used == text.size() && value >= 1) return value;
  } catch (const std::logic_error&) {  // std::stoll: not a number, or out of range
  }
  return std::nullopt;
}

std::vector<std::int64_t> parse_widths(const std::string& text) {
  std::vector<std::int64_t> widths;
  for (const auto& item : split_list(text)) {
    const auto width = positive_integer(item);
    if (!width)
      throw UsageError("--hidden: '" + text + "' is not a comma-separated list of positive widths");
    widths.push_back(*width);
  }
  return widths;
}

// --micro-batch-cost pieces|auto|fixed=F[,width=X]: F >= 0 padded tokens per micro-batch, X >= 0
// per padded token per unit of width.
train::TrainOptions::MicroBatchCost parse_micro_batch_cost(const std::string& text,
                                                           train::TrainOptions& o) {
  using Cost = train::TrainOptions::MicroBatchCost;
  if (text == "pieces") return Cost::kPieces;
  if (text == "auto") return Cost::kAuto;
  const auto refuse = [&](const std::string& why) {
    return UsageError("--micro-batch-cost: '" + text + "' " + why +
                      " (pieces, auto, or fixed=F[,width=X] with F padded tokens per "
                      "micro-batch and X per padded token per unit of width, both >= 0)");
  };
  bool fixed_seen = false;
  for (const auto& item : split_list(text)) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) throw refuse("is not one of the forms");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    double number = 0;
    try {
      std::size_t used = 0;
      number = std::stod(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::logic_error&) {  // not a number, trailing text, or out of range
      throw refuse("has '" + value + "', not a number");
    }
    if (!(number >= 0) || !std::isfinite(number)) throw refuse("has " + value + " below 0");
    if (key == "fixed") {
      o.cost_fixed = number;
      fixed_seen = true;
    } else if (key == "width") {
      o.cost_width = number;
    } else {
      throw refuse("names '" + key + "'");
    }
  }
  if (!fixed_seen) throw refuse("gives no fixed=F");
  return Cost::kGiven;
}

// --memory-limit SIZE, or a list: rank i takes item i (cycling).
void read_memory_limits(const std::string& text, train::TrainOptions& o) {
  std::vector<std::string> items;  // empty items kept: "8MiB,,16MiB" is an error
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    items.push_back(item);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string what =
        items.size() > 1 ? "--memory-limit (item " + std::to_string(i + 1) + " of '" + text + "')"
                         : std::string("--memory-limit");
    o.memory_limits.push_back(memory::parse_size(items[i], what));
  }
  if (o.memory_limits.empty()) throw UsageError("--memory-limit: '" + text + "' is empty");
  o.memory_limit = o.memory_limits.front();
  if (o.memory_limits.size() == 1) o.memory_limits.clear();
}

// What to train on, and with which model and loss.
void read_model_and_data(const po::variables_map& vm, train::TrainOptions& o) {
  o.data = split_paths(vm["data"].as<std::vector<std::string>>());
  if (vm.count("val-data")) o.val_data = split_paths(vm["val-data"].as<std::vector<std::string>>());
  o.inputs = split_list(vm["inputs"].as<std::string>());
  if (o.inputs.empty()) throw UsageError("--inputs: no dataset named");
  o.targets = vm["targets"].as<std::string>();
  o.model = vm["model"].as<std::string>();
  o.hidden = parse_widths(vm["hidden"].as<std::string>());
  if (vm.count("model-file")) o.model_file = vm["model-file"].as<std::string>();
  o.loss = vm["loss"].as<std::string>();
  if (o.loss != "auto" && o.loss != "cross-entropy" && o.loss != "mse" && o.loss != "bce" &&
      o.loss != "model")
    throw UsageError("--loss: '" + o.loss + "' is not one of auto, cross-entropy, mse, bce, model");
  o.ignore_index = vm["ignore-index"].as<std::int64_t>();
}

// The global batch and how each rank's share is cut into micro-batches.
void read_batch(const po::variables_map& vm, train::TrainOptions& o) {
  o.global_batch = vm["global-batch"].as<std::int64_t>();
  if (vm.count("global-batch-tokens")) {
    o.global_batch_tokens = vm["global-batch-tokens"].as<std::int64_t>();
    if (!vm["global-batch"].defaulted())
      throw UsageError("give --global-batch (documents) or --global-batch-tokens, not both");
    if (o.global_batch_tokens < 1)
      throw UsageError("--global-batch-tokens must be at least 1 (got " +
                       std::to_string(o.global_batch_tokens) + ")");
  }
  if (o.global_batch < 1)
    throw UsageError("--global-batch must be at least 1 (got " + std::to_string(o.global_batch) +
                     ")");
  const std::string micro = vm["micro-batch"].as<std::string>();
  o.micro_batch_given = !vm["micro-batch"].defaulted();
  if (micro != "auto") {
    o.micro_batch = positive_integer(micro);
    if (!o.micro_batch)
      throw UsageError("--micro-batch: '" + micro + "' is not 'auto' or a positive integer");
  }
  if (vm.count("micro-batch-tokens")) {
    const std::string tokens = vm["micro-batch-tokens"].as<std::string>();
    o.micro_batch_tokens_given = true;
    if (tokens != "auto") {
      o.micro_batch_tokens = positive_integer(tokens);
      if (!o.micro_batch_tokens)
        throw UsageError("--micro-batch-tokens: '" + tokens +
                         "' is not 'auto' or a positive integer");
    }
  }
  const std::string search = vm["micro-batch-search"].as<std::string>();
  if (search != "predict" && search != "halve" && search != "refine")
    throw UsageError("--micro-batch-search: '" + search + "' is not one of predict, halve, refine");
  o.predict_micro_batch = search == "predict";
  o.refine_micro_batch = search == "refine";
  const std::string token_cost = vm["token-cost"].as<std::string>();
  if (token_cost != "flat" && token_cost != "memory")
    throw UsageError("--token-cost: '" + token_cost + "' is not one of flat, memory");
  o.token_cost_by_memory = token_cost == "memory";
  o.micro_batch_cost = parse_micro_batch_cost(vm["micro-batch-cost"].as<std::string>(), o);
  o.micro_batch_cost_given = !vm["micro-batch-cost"].defaulted();
  if (vm.count("micro-batch-regrow")) {
    o.micro_batch_regrow = vm["micro-batch-regrow"].as<std::int64_t>();
    if (o.micro_batch_regrow < 0)
      throw UsageError("--micro-batch-regrow must be 0 (never) or a number of steps (got " +
                       std::to_string(o.micro_batch_regrow) + ")");
  }
  o.memory_margin = vm["memory-margin"].as<double>();
  if (!(o.memory_margin >= 0 && o.memory_margin < 1))
    throw UsageError("--memory-margin must be in [0, 1) (got " + std::to_string(o.memory_margin) +
                     ")");
}

// How long, in which order, and the optimizer's update.
void read_optimization(const po::variables_map& vm, train::TrainOptions& o) {
  o.steps = vm["steps"].as<std::int64_t>();
  o.epochs = vm["epochs"].as<double>();
  if (o.steps < 0) throw UsageError("--steps must not be negative");
  if (o.epochs < 0) throw UsageError("--epochs must not be negative");
  if (o.steps > 0 && o.epochs > 0) throw UsageError("give --steps or --epochs, not both");
  o.shuffle = vm["shuffle"].as<std::string>();
  if (o.shuffle != "batch" && o.shuffle != "none")
    throw UsageError("--shuffle: '" + o.shuffle + "' is not one of batch, none");
  o.optimizer = vm["optimizer"].as<std::string>();
  if (o.optimizer != "sgd" && o.optimizer != "adamw")
    throw UsageError("--optimizer: '" + o.optimizer + "' is not one of sgd, adamw");
  o.lr = vm["lr"].as<double>();
  if (!(o.lr > 0)) throw UsageError("--lr must be positive (got " + std::to_string(o.lr) + ")");
  o.momentum = vm["momentum"].as<double>();
  if (o.momentum < 0 || o.momentum >= 1) throw UsageError("--momentum must be in [0, 1)");
  o.weight_decay = vm["weight-decay"].as<double>();
  if (o.weight_decay < 0) throw UsageError("--weight-decay must not be negative");
  o.warmup_steps = vm["warmup-steps"].as<std::int64_t>();
  if (o.warmup_steps < 0) throw UsageError("--warmup-steps must not be negative");
  o.schedule = vm["schedule"].as<std::string>();
  if (o.schedule != "constant" && o.schedule != "cosine")
    throw UsageError("--schedule: '" + o.schedule + "' is not one of constant, cosine");
  o.clip_grad_norm = vm["clip-grad-norm"].as<double>();
  if (o.clip_grad_norm < 0) throw UsageError("--clip-grad-norm must not be negative");
  o.on_nonfinite = vm["on-nonfinite"].as<std::string>();
  if (o.on_nonfinite != "stop" && o.on_nonfinite != "skip") {
    throw UsageError("--on-nonfinite: '" + o.on_nonfinite + "' is not one of stop, skip");
  }
}

// The hardware each rank runs on: precision, threads, device, backend, memory limits, balance.
void read_hardware(const po::variables_map& vm, train::TrainOptions& o) {
  o.precision = train::parse_precision(vm["precision"].as<std::string>());
  o.seed = vm["seed"].as<std::uint64_t>();
  o.threads = vm["threads"].as<int>();
  if (o.threads < 0) throw UsageError("--threads must not be negative");
  o.device = vm["device"].as<std::string>();
  if (o.device != "cpu" && o.device != "cuda" && o.device != "auto")
    throw UsageError("--device: '" + o.device + "' is not one of cpu, cuda, auto");
  o.backend = vm["backend"].as<std::string>();
  if (comm::parse_backend(o.backend) == comm::Backend::kNccl && o.device != "cuda") {
    throw UsageError("--backend nccl needs --device cuda: NCCL reduces GPU memory only");
  }
  read_memory_limits(vm["memory-limit"].as<std::string>(), o);
  const std::string scope = vm["micro-batch-scope"].as<std::string>();
  if (scope != "global" && scope != "rank")
    throw UsageError("--micro-batch-scope: '" + scope + "' is not one of global, rank");
  o.micro_batch_per_rank = scope == "rank";
  const std::string balance = vm["balance"].as<std::string>();
  if (balance != "none" && balance != "throughput")
    throw UsageError("--balance: '" + balance + "' is not one of none, throughput");
  o.balance = balance == "throughput";
  o.balance_every = vm["balance-every"].as<std::int64_t>();
  if (o.balance_every < 1)
    throw UsageError("--balance-every must be at least 1 (got " + std::to_string(o.balance_every) +
                     ")");
}

// Fault drills, for tests and rehearsals.
void read_drills(const po::variables_map& vm, train::TrainOptions& o) {
  if (vm.count("inject-slow"))
    o.inject_slow = train::parse_slow_injections(vm["inject-slow"].as<std::string>());
  if (vm.count("inject-oom"))
    o.inject_oom = memory::parse_oom_injections(vm["inject-oom"].as<std::string>());
  if (vm.count("inject-overflow"))
    o.inject_overflow = train::parse_overflow_injections(vm["inject-overflow"].as<std::string>());
  if (vm.count("inject-stall"))
    o.inject_stall = core::parse_stall_injections(vm["inject-stall"].as<std::string>());
}

// How the gradients travel, and how long a collective may take.
void read_reduction(const po::variables_map& vm, train::TrainOptions& o) {
  o.overlap = vm["overlap"].as<std::string>();
  if (o.overlap != "auto" && o.overlap != "on" && o.overlap != "off")
    throw UsageError("--overlap: '" + o.overlap + "' is not one of auto, on, off");
  o.shard = vm["shard"].as<std::string>();
  if (o.shard != "none" && o.shard != "optimizer" && o.shard != "gradients")
    throw UsageError("--shard: '" + o.shard + "' is not one of none, optimizer, gradients");
  o.bucket_mib = vm["bucket-mib"].as<double>();
  if (!(o.bucket_mib > 0) || !std::isfinite(o.bucket_mib) || o.bucket_mib > 4096)
    throw UsageError("--bucket-mib: must be a size in MiB above 0 and at most 4096");
  o.collective_timeout_seconds = vm["collective-timeout"].as<double>();
  if (!(o.collective_timeout_seconds >= 0) || !std::isfinite(o.collective_timeout_seconds))
    throw UsageError("--collective-timeout: must be a number of seconds >= 0 (0: no deadline)");
  if (o.collective_timeout_seconds > 0 && o.collective_timeout_seconds < 1)
    throw UsageError(
        "--collective-timeout: less than 1 s would stop healthy runs (a rank "
        "waiting for a slower one); use at least 1, or 0 for no deadline");
}

// What the run writes, when it evaluates, and where it resumes from.
void read_outputs(const po::variables_map& vm, train::TrainOptions& o) {
  if (vm.count("run-log")) o.run_log = vm["run-log"].as<std::string>();
  if (vm.count("checkpoint")) o.checkpoint = vm["checkpoint"].as<std::string>();
  o.checkpoint_every = vm["checkpoint-every"].as<std::int64_t>();
  o.keep_checkpoints = vm["keep-checkpoints"].as<std::int64_t>();
  if (o.keep_checkpoints < 1 || o.keep_checkpoints > 1000)
    throw UsageError("--keep-checkpoints: must be between 1 and 1000 (got " +
                     std::to_string(o.keep_checkpoints) + ")");
  o.resume = vm["resume"].as<bool>();
  o.resume_reshape = vm["resume-reshape"].as<bool>();
  if (o.resume_reshape) o.resume = true;
  o.dry_run = vm["dry-run"].as<bool>();
  if (o.dry_run && o.resume) throw UsageError("--dry-run trains nothing: drop --resume");
  if (o.dry_run) {
    o.run_log.clear();  // nothing is written: a dry run never takes or changes the outputs
    o.checkpoint.clear();
  }
  if (o.resume && o.checkpoint.empty()) throw UsageError("--resume needs --checkpoint FILE");
  o.eval_every = vm["eval-every"].as<std::int64_t>();
  o.log_every = vm["log-every"].as<std::int64_t>();
  o.log_flush_every = vm["log-flush-every"].as<std::int64_t>();
  if (o.log_flush_every < 0) throw UsageError("--log-flush-every must not be negative");
  o.eval_micro_batch = vm["eval-micro-batch"].as<std::int64_t>();
}

train::TrainOptions to_options(const po::variables_map& vm) {
  train::TrainOptions o;
  read_model_and_data(vm, o);
  read_batch(vm, o);
  read_optimization(vm, o);
  read_hardware(vm, o);
  read_drills(vm, o);
  read_reduction(vm, o);
  read_outputs(vm, o);
  o.command_line = command_line();
  return o;
}

// What to train on, and with which model and loss.
void add_model_and_data_options(po::options_description_easy_init add) {
  add("data",
      po::value<std::vector<std::string>>()->multitoken()->required()->value_name("FILE..."),
      "training file(s) or glob(s); shards are concatenated in order");
  add("val-data", po::value<std::vector<std::string>>()->multitoken()->value_name("FILE..."),
      "evaluation file(s), evaluated every --eval-every steps and at the end");
  add("inputs", po::value<std::string>()->default_value("x")->value_name("A[,B]"),
      "input dataset(s); document data: tokens, or tokens,lengths");
  add("targets", po::value<std::string>()->default_value("y")->value_name("Y"),
      "target dataset: int64 labels (cross-entropy) or float32 values (mean squared error); "
      "document data: next (the next token), or a labels dataset per token or per document");
  add("model", po::value<std::string>()->default_value("mlp")->value_name("mlp|cnn"),
      "built-in model");
  add("hidden", po::value<std::string>()->default_value("512,512")->value_name("W,W"),
      "mlp hidden widths");
  add("model-file", po::value<std::string>()->value_name("M.pt"),
      "TorchScript module (overrides --model)");
  add("loss",
      po::value<std::string>()->default_value("auto")->value_name(
          "auto|cross-entropy|mse|bce|model"),
      "auto: cross-entropy for integer targets ([rows] or tokens [rows, T]), mse for float; "
      "model: forward(inputs..., targets) returns (loss_sum, weight)");
  add("ignore-index", po::value<std::int64_t>()->default_value(-100)->value_name("L"),
      "integer label the cross-entropy skips (padding); the loss is the mean over the rest");
}

// The global batch and its micro-batches.
void add_batch_options(po::options_description_easy_init add) {
  add("global-batch-tokens", po::value<std::int64_t>()->value_name("N"),
      "document data: each batch takes whole documents in order while its tokens stay within N "
      "(instead of --global-batch documents)");
  add("global-batch", po::value<std::int64_t>()->default_value(256)->value_name("B"),
      "samples per optimizer step, all ranks together");
  add("micro-batch", po::value<std::string>()->default_value("auto")->value_name("auto|N"),
      "rows per forward/backward on a rank: auto finds the largest that fits");
  add("micro-batch-tokens", po::value<std::string>()->value_name("auto|N"),
      "document data: padded tokens (documents x longest) per forward/backward on a rank; "
      "auto (the default there) starts at a rank's whole share and halves on out-of-memory");
  add("micro-batch-search",
      po::value<std::string>()->default_value("predict")->value_name("predict|halve|refine"),
      "auto: predict measures two small micro-batches before the first step and starts at the "
      "largest its memory model says fits (halving, then bisecting upwards, if one runs out); "
      "halve: start at the whole share and halve after each OOM; refine: halve, then bisect "
      "upwards on later steps");
  add("token-cost", po::value<std::string>()->default_value("flat")->value_name("flat|memory"),
      "document data, automatic budget: flat counts every padded token alike; memory lets a "
      "micro-batch of shorter documents take more tokens, as many as fit in the memory the "
      "budget takes at the longest width (fewer micro-batches, more padding)");
  add("micro-batch-cost",
      po::value<std::string>()->default_value("auto")->value_name("auto|pieces|fixed=F[,width=X]"),
      "document data: how each rank's documents are cut under its budget. auto: the least "
      "predicted time, each rank's compute per micro-batch fitted by a time probe before the "
      "first step (kept in the checkpoint); pieces: the fewest micro-batches, then the least "
      "padding (the same cuts on every fresh start); fixed=F[,width=X]: the least predicted "
      "time with F padded tokens' worth of time per micro-batch and X more per padded token per "
      "unit of width (reproducible across fresh starts)");
  add("micro-batch-regrow", po::value<std::int64_t>()->value_name("N"),
      "after an out-of-memory lowered an automatic micro-batch, try the size before once more "
      "after N clean steps (a transient peak), at the cost of at most one more out-of-memory; "
      "0: never (default: 100 with --micro-batch-search predict, 0 with halve and refine)");
  add("memory-margin", po::value<double>()->default_value(0.05, "0.05")->value_name("F"),
      "--micro-batch-search predict: the fraction of the memory above the model's fixed state "
      "left unused, for what the model does not foresee (fragmentation, other allocations)");
}

// How long, in which order, and the optimizer's update.
void add_optimization_options(po::options_description_easy_init add) {
  add("steps", po::value<std::int64_t>()->default_value(0)->value_name("N"), "optimizer steps");
  add("epochs", po::value<double>()->default_value(0, "0")->value_name("E"),
      "epochs (instead of --steps)");
  add("shuffle", po::value<std::string>()->default_value("batch")->value_name("batch|none"),
      "permute whole batches per epoch from --seed, or keep file order");
  add("optimizer", po::value<std::string>()->default_value("sgd")->value_name("sgd|adamw"),
      "optimizer");
  add("lr", po::value<double>()->default_value(0.05, "0.05")->value_name("LR"), "learning rate");
  add("momentum", po::value<double>()->default_value(0.9, "0.9")->value_name("M"), "SGD momentum");
  add("weight-decay", po::value<double>()->default_value(0.0, "0")->value_name("WD"),
      "weight decay");
  add("warmup-steps", po::value<std::int64_t>()->default_value(0)->value_name("N"),
      "linear warm-up steps");
  add("schedule",
      po::value<std::string>()->default_value("constant")->value_name("constant|cosine"),
      "learning-rate schedule after warm-up");
  add("clip-grad-norm", po::value<double>()->default_value(0.0, "0")->value_name("C"),
      "clip the global gradient norm (0: off)");
  add("on-nonfinite", po::value<std::string>()->default_value("stop")->value_name("stop|skip"),
      "NaN/Inf in the loss or gradients on any rank: stop with an error, or skip the step");
}

// Where each rank computes and how its gradients travel.
void add_device_options(po::options_description_easy_init add) {
  add("precision", po::value<std::string>()->default_value("fp32")->value_name("fp32|bf16|fp16"),
      "bf16/fp16: forward and loss under autocast (matrix products in the lower precision); "
      "parameters, optimizer state and accumulated gradients stay fp32. fp16: GPUs only");
  add("seed", po::value<std::uint64_t>()->default_value(0)->value_name("S"),
      "seed for initialisation and shuffling");
  add("threads", po::value<int>()->default_value(0)->value_name("T"),
      "intra-op threads per rank (0: cores on the node / ranks on the node)");
  add("device", po::value<std::string>()->default_value("cpu")->value_name("cpu|cuda|auto"),
      "device");
  add("backend", po::value<std::string>()->default_value("auto")->value_name("auto|mpi|nccl"),
      "gradient all-reduce backend");
  add("overlap", po::value<std::string>()->default_value("auto")->value_name("auto|on|off"),
      "all-reduce the gradients (sharded: reduce them to the ranks owning them) in buckets "
      "while the last micro-batch's backward pass runs, instead of after it (same sums, same "
      "out-of-memory agreement). auto: on when the ranks "
      "span several nodes (CPU); on one node the all-reduce is shared memory and cheap; on "
      "GPUs (NCCL) only with on");
  add("shard",
      po::value<std::string>()->default_value("none")->value_name("none|optimizer|gradients"),
      "optimizer: each rank keeps the optimizer state of, and updates, a 1/W slice of the "
      "parameters (gradients reduce-scattered, or reduced in buckets with --overlap, before the "
      "step's agreement; parameters all-gathered after an accepted step), so memory per rank "
      "shrinks as ranks are added. gradients: also only its slice of the accumulated gradients "
      "(every micro-batch's gradients reduced in buckets to the ranks owning them as backward "
      "makes them)");
  add("bucket-mib", po::value<double>()->default_value(1, "1")->value_name("MIB"),
      "--overlap and --shard gradients: gradient bytes per bucket (a larger parameter makes a "
      "bucket of its own)");
}

// Each rank's memory and share of the batch.
void add_memory_options(po::options_description_easy_init add) {
  add("memory-limit", po::value<std::string>()->default_value("none")->value_name("SIZE[,SIZE..]"),
      "memory budget per rank, e.g. 96MiB; past it allocations fail as on a full GPU. A list "
      "gives rank i item i (cycling): mixed nodes, drills");
  add("micro-batch-scope",
      po::value<std::string>()->default_value("global")->value_name("global|rank"),
      "global: any rank's out-of-memory halves every rank's micro-batch; rank: only the ranks "
      "that ran out halve theirs (mixed hardware)");
  add("balance", po::value<std::string>()->default_value("none")->value_name("none|throughput"),
      "throughput: every --balance-every steps, share the global batch among the ranks in "
      "proportion to their measured speed (mixed hardware; exact all the same)");
  add("balance-every", po::value<std::int64_t>()->default_value(50)->value_name("N"),
      "steps between two rebalances (--balance throughput)");
}

// Fault drills, and the deadline that catches a hang.
void add_drill_options(po::options_description_easy_init add) {
  add("inject-slow", po::value<std::string>()->value_name("rank=R,factor=F[;...]"),
      "drill: rank R takes F times as long per row (tests --balance on equal cores)");
  add("inject-oom", po::value<std::string>()->value_name("rank=R,above=M[,step=S][;...]"),
      "drill: rank R runs out of memory whenever a micro-batch has more than M rows");
  add("inject-overflow", po::value<std::string>()->value_name("rank=R,step=S[;...]"),
      "drill: rank R's loss at step S is made infinite before backward, as an fp16 overflow");
  add("inject-stall", po::value<std::string>()->value_name("rank=R,step=S,seconds=T[;...]"),
      "drill: rank R stops for T seconds at the start of step S (a hung file system or GPU); "
      "a stop signal ends it early");
  add("collective-timeout", po::value<double>()->default_value(600, "600")->value_name("SECONDS"),
      "deadline of every collective: past it the ranks that can still talk end the job with "
      "exit code 5 and one line naming the ranks that did not arrive (0: wait forever). Raise "
      "it if a step, an evaluation or a checkpoint write legitimately takes longer");
}

// What the run writes, when it evaluates, and where it resumes from.
void add_output_options(po::options_description_easy_init add) {
  add("run-log", po::value<std::string>()->value_name("FILE.h5"),
      "HDF5 run log (written by rank 0)");
  add("checkpoint", po::value<std::string>()->value_name("FILE.h5"), "HDF5 checkpoint file");
  add("checkpoint-every", po::value<std::int64_t>()->default_value(0)->value_name("N"),
      "write a checkpoint every N steps (and always at the end)");
  add("keep-checkpoints", po::value<std::int64_t>()->default_value(2)->value_name("N"),
      "keep the last N checkpoints: --checkpoint names the newest, older ones are named by "
      "their step (c.h5 -> c.step40.h5); --resume goes back to the newest that verifies");
  add("dry-run", po::bool_switch()->default_value(false),
      "set up, measure two micro-batches per rank and print the micro-batch each rank is "
      "predicted to hold under its memory limit and the largest global batch without "
      "accumulation; then exit without training or writing --run-log / --checkpoint");
  add("resume", po::bool_switch()->default_value(false),
      "continue from --checkpoint if it exists. --global-batch, --shuffle, --seed (with "
      "--shuffle batch) and the data must be the checkpoint's (else refused: the rows read "
      "would change); the number of ranks, --micro-batch and the rest may change");
  add("resume-reshape", po::bool_switch()->default_value(false),
      "--resume, and a changed --global-batch(-tokens), --shuffle or --seed is taken from the "
      "checkpoint's epoch boundary on: the next epoch reads every row once in the new order. "
      "Refused in the middle of an epoch (the error says how to finish it first)");
  add("eval-every", po::value<std::int64_t>()->default_value(0)->value_name("N"),
      "evaluate every N steps");
  add("eval-micro-batch", po::value<std::int64_t>()->default_value(0)->value_name("N"),
      "rows per evaluation forward; document data: padded tokens (0: automatic)");
  add("log-every", po::value<std::int64_t>()->default_value(10)->value_name("N"),
      "progress line every N steps");
  add("log-flush-every", po::value<std::int64_t>()->default_value(0)->value_name("N"),
      "write the run log every N steps (0: automatic, at most ~2% of the run's time)");
}

}  // namespace

Command train_command() {
  Command c;
  c.name = "train";
  c.summary = "Train with automatic micro-batching (run under mpirun or srun).";
  c.usage = "autoaccum train --data FILE... --global-batch B (--steps N | --epochs E) [options]";
  c.accepts_config = true;
  auto add = c.options.add_options();
  add_model_and_data_options(add);
  add_batch_options(add);
  add_optimization_options(add);
  add_device_options(add);
  add_memory_options(add);
  add_drill_options(add);
  add_output_options(add);
  c.run = [](const po::variables_map& vm, comm::Communicator& world) {
    train::TrainOptions options;
    comm::collectively(world, [&] { options = to_options(vm); });
    train::install_stop_signals();
    train::Trainer trainer(options, world);
    const train::TrainResult result = trainer.run();
    return result.preempted ? static_cast<int>(ExitCode::kPreempted) : 0;
  };
  return c;
}

}  // namespace autoaccum::cli
