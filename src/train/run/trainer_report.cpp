// What the run tells at its start: the run log's header (or its resume row) and the banner.
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/precision.hpp"
#include "autoaccum/train/run/observers.hpp"

#include "run_state.hpp"

namespace autoaccum::train {

void Trainer::State::open_observers() {
  if (!options.run_log.empty()) {
    comm::collectively(comm, [&] {
      if (!root) return;
      // A resumed run adds to its log; a new one writes a new log.
      const bool append = options.resume && step > 0 && access(options.run_log.c_str(), F_OK) == 0;
      reporter.add(std::make_unique<RunLogObserver>(
          append ? io::RunLogWriter::append(options.run_log, step, comm.hosts(),
                                            options.command_line, resume_row())
                 : io::RunLogWriter::create(options.run_log, run_log_header()),
          options.log_flush_every));
    });
  }
  if (root && !options.quiet) {
    reporter.add(std::make_unique<ProgressObserver>(options.log_every, step, feed.total_steps()));
  }
}

// The run log's row for this resume.
io::ResumeRow Trainer::State::resume_row() const {
  io::ResumeRow resumed;
  resumed.global_batch =
      options.global_batch_tokens > 0 ? options.global_batch_tokens : options.global_batch;
  resumed.reshaped = feed.reshaped() ? 1 : 0;
  resumed.skipped_checkpoints = static_cast<std::int64_t>(resume_skipped.size());
  resumed.checkpoint = resumed_from;
  for (const auto& line : resume_skipped)
    resumed.skipped += (resumed.skipped.empty() ? "" : "; ") + line;
  return resumed;
}

// A new run log's attributes: what the run is, as its banner says it.
io::RunLogHeader Trainer::State::run_log_header() const {
  io::RunLogHeader header;
  header.world_size = world;
  header.global_batch = feed.plan().by_tokens() ? 0 : options.global_batch;
  header.micro_batch_mode = sizing.micro_batches().automatic() ? "auto" : "fixed";
  header.command_line = options.command_line;
  header.started_at = io::utc_now();
  header.hostnames = comm.hosts();  // gathered when the communicator was made
  // Each rank's fixed bytes, as this run holds them: "1234,1234,1230" (schema 12).
  const auto state_floats = static_cast<int>(optimizer->state_kinds().size());
  const auto largest_fixed_bytes = [&](ShardLevel level) {
    const std::vector<std::int64_t> bytes = exchange->fixed_bytes(level, state_floats);
    return static_cast<double>(*std::max_element(bytes.begin(), bytes.end()));
  };
  std::string fixed_bytes_list;
  for (const std::int64_t b : exchange->fixed_bytes(exchange->level(), state_floats))
    fixed_bytes_list += (fixed_bytes_list.empty() ? "" : ",") + std::to_string(b);
  header.text = {
      {"model", bundle->model().describe()},
      {"loss", bundle->objective().describe()},
      {"optimizer", options.optimizer},
      {"schedule", options.schedule},
      {"data", feed.reader().paths().front() +
                   (feed.reader().paths().size() > 1
                        ? " (+" + std::to_string(feed.reader().paths().size() - 1) + " shards)"
                        : "")},
      {"memory_limit", sizing.limits().option_text()},
      {"micro_batch_scope", sizing.micro_batches().per_rank() ? "rank" : "global"},
      {"balance", balance_text()},
      {"overlap", exchange->description()},
      {"shard", to_string(exchange->level())},
      {"micro_batch_cost", feed.cut_text()},
      {"fixed_bytes_counted", fixed_bytes_list},
      {"precision", to_string(options.precision)},
      {"micro_batch_unit", documents() ? "tokens" : "rows"}};
  header.numbers = {
      {"lr", options.lr},
      {"memory_limit_bytes", static_cast<double>(options.memory_limit)},
      {"feed.total_steps()", static_cast<double>(feed.total_steps())},
      {"parameters", static_cast<double>(bundle->parameters().trainable_elements)},
      {"frozen_parameters", static_cast<double>(bundle->parameters().frozen_elements)},
      {"shared_parameters", static_cast<double>(bundle->parameters().shared_elements)},
      {"averaged_buffer_values", static_cast<double>(bundle->state().averaged_values())},
      {"threads_per_rank", static_cast<double>(at::get_num_threads())},
      {"lower_precision_gemm_speedup", lower_gemm_speedup},
      {"global_batch_tokens", static_cast<double>(options.global_batch_tokens)},
      {"gradient_buckets", static_cast<double>(exchange->buckets())},
      {"bucket_bytes", static_cast<double>(exchange->bucket_bytes())},
      {"fixed_bytes_counted_unsharded", largest_fixed_bytes(ShardLevel::kNone)},
      {"fixed_bytes_counted_optimizer", largest_fixed_bytes(ShardLevel::kOptimizer)},
      {"fixed_bytes_counted_gradients", largest_fixed_bytes(ShardLevel::kGradients)}};
  return header;
}

std::string Trainer::State::sizes_text_for_banner() const {
  std::ostringstream text;
  if (documents()) {
    text << feed.reader().schema().describe_documents() << "\nautoaccum: global batch ";
    if (feed.plan().by_tokens()) {
      text << "up to " << options.global_batch_tokens << " tokens of whole documents (at most "
           << feed.plan().global_batch() << " documents)";
    } else {
      text << options.global_batch << " documents";
    }
    text << ", split between ranks by tokens (" << feed.plan().batches_per_epoch()
         << " batches per epoch), " << feed.total_steps() << " steps; micro-batch tokens "
         << (sizing.micro_batches().automatic() ? "auto" : "fixed")
         << (sizing.micro_batches().per_rank() ? " per rank" : "")
         << (sizing.micro_batches().automatic() ? ", starting at " : " at ")
         << sizing.micro_batches().describe() << " padded tokens (documents x longest)"
         << (options.token_cost_by_memory
                 ? ", spent by memory (--token-cost memory: shorter documents take more tokens)"
                 : "")
         << "; cut " << feed.cut_text();
  } else {
    text << feed.reader().schema().rows << " rows, global batch " << options.global_batch << " ("
         << feed.plan().batches_per_epoch() << " batches per epoch), " << feed.total_steps()
         << " steps; micro-batch " << (sizing.micro_batches().automatic() ? "auto" : "fixed")
         << (sizing.micro_batches().per_rank() ? " per rank" : "")
         << (sizing.micro_batches().automatic() ? ", starting at " : " at ")
         << sizing.micro_batches().describe();
  }
  return text.str();
}

void Trainer::State::announce() {
  const std::size_t nodes = exchange->nodes();
  std::ostringstream banner;
  banner << "autoaccum: " << world << " rank(s) on " << nodes << " node(s), "
         << at::get_num_threads() << " thread(s) per rank (" << thread_source << "); "
         << bundle->describe();
  banner << "\nautoaccum: loss: " << bundle->objective().describe() << "\nautoaccum: ";
  banner << sizes_text_for_banner();
  banner << "; memory limit " << sizing.limits().option_text()
         << (options.memory_limits.empty() && options.memory_limit > 0 ? " per rank" : "");
  banner << "\nautoaccum: "
         << describe_precision(options.precision, context.use_cuda, lower_gemm_speedup,
                               gemm_probe_failure);
  if (loss_scale.enabled()) {
    banner << "\nautoaccum: fp16 loss scale " << loss_scale.value()
           << ", halved on every rank when the gradients overflow, doubled after "
           << LossScale::kGrowthInterval << " clean steps";
    if (!context.use_cuda)
      banner << " (AUTOACCUM_FP16_ON_CPU: products in bf16 on this CPU; for tests)";
  }
  if (options.balance) banner << "\nautoaccum: balance: " << balance_text();
  if (world > 1) banner << "\nautoaccum: gradient all-reduce " << exchange->description();
  if (world > 1 && (sharded() || options.dry_run)) {
    const auto state_floats = static_cast<int>(optimizer->state_kinds().size());
    banner << "\nautoaccum: " << exchange->fixed_bytes_text(state_floats);
  }
  for (const auto& slow : options.inject_slow) {
    banner << "\nautoaccum: drill: rank " << slow.rank << " made " << slow.factor
           << "x slower per row (--inject-slow)";
  }
  if (step > 0)
    banner << "\nautoaccum: resumed at step " << step << " with micro-batch "
           << sizing.micro_batches().describe();
  reporter.say(banner.str());
  reporter.say_notes();
}

}  // namespace autoaccum::train
