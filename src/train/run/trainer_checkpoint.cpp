// Trainer checkpoints: writing one (rank 0, with every rank's random stream), choosing and
// reading one on resume (rank 0 chooses, all read it), and mapping what it learned onto this
// run's ranks.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>

#include "../trainer_state.hpp"
#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/console.hpp"

namespace autoaccum::train {
namespace {

// FNV-1a, 64 bits: enough to tell one data file from another of the same shape.
struct Fingerprint {
  std::uint64_t value = 14695981039346656037ull;
  void add(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i)
      value = (value ^ p[i]) * 1099511628211ull;
  }
  void add(const std::string& text) { add(text.data(), text.size()); }
  void add(std::int64_t number) { add(&number, sizeof number); }
  std::string hex() const {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
    return text;
  }
};

std::string basename_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string files_text(const io::DataOrder& d) {
  std::string text;
  for (std::size_t i = 0; i < d.files.size() && i < 3; ++i)
    text += (i ? ", " : "") + d.files[i];
  if (d.files.size() > 3) text += " (+" + std::to_string(d.files.size() - 3) + " files)";
  return text;
}

// What differs between the checkpoint's data order and this run's: nothing, the order (global
// batch, shuffle, seed: --resume-reshape can take it at an epoch boundary), or the data itself
// (never). `what` names the option and both values.
struct OrderChange {
  enum Kind { kNone, kOrder, kData } kind = kNone;
  std::string what;  // "--global-batch 32, this run has 64"
};

OrderChange data_order_change(const io::Checkpoint& saved_run, const io::DataOrder& now,
                              std::uint64_t seed) {
  const io::DataOrder& saved = saved_run.data;
  if (saved.global_batch == 0) return {};  // written before autoaccum recorded it
  // "--global-batch 32, this run has 64", or across the two kinds of batch, each named.
  const auto option = [](const io::DataOrder& d) {
    return d.global_batch_tokens > 0 ? std::string("--global-batch-tokens")
                                     : std::string("--global-batch");
  };
  const auto value = [](const io::DataOrder& d) {
    return std::to_string(d.global_batch_tokens > 0 ? d.global_batch_tokens : d.global_batch);
  };
  if (saved.rows != now.rows || saved.fingerprint != now.fingerprint)
    return {OrderChange::kData, "--data " + files_text(saved) + " (" + std::to_string(saved.rows) +
                                    " rows, fingerprint " + saved.fingerprint + "), this run has " +
                                    files_text(now) + " (" + std::to_string(now.rows) +
                                    " rows, fingerprint " + now.fingerprint + ")"};
  if (option(saved) != option(now))
    return {OrderChange::kOrder, option(saved) + " " + value(saved) + ", this run has " +
                                     option(now) + " " + value(now)};
  if (value(saved) != value(now))
    return {OrderChange::kOrder,
            option(saved) + " " + value(saved) + ", this run has " + value(now)};
  if (saved.shuffle != now.shuffle)
    return {OrderChange::kOrder, "--shuffle " + saved.shuffle + ", this run has " + now.shuffle};
  // The seed orders the batches of every epoch (with --shuffle none it orders nothing).
  if (saved.shuffle == "batch" && saved_run.seed != seed)
    return {OrderChange::kOrder,
            "--seed " + std::to_string(saved_run.seed) + ", this run has " + std::to_string(seed)};
  return {};
}

// Batches per epoch in the checkpoint's order (the data are this run's: checked before).
std::int64_t old_batches_per_epoch(const io::Checkpoint& c, const data::DataSchema& schema) {
  const io::DataOrder& d = c.data;
  if (d.global_batch_tokens > 0) {
    // The cut does not depend on the ranks: one rank validates the least.
    return data::BatchPlan::by_tokens(schema.lengths, d.global_batch_tokens, 1,
                                      data::parse_shuffle(d.shuffle), c.seed)
        .batches_per_epoch();
  }
  return d.rows / d.global_batch;
}

// The checkpoint's data options as a command line would give them.
std::string order_options(const io::Checkpoint& c) {
  const io::DataOrder& d = c.data;
  std::string text = d.global_batch_tokens > 0
                         ? "--global-batch-tokens " + std::to_string(d.global_batch_tokens)
                         : "--global-batch " + std::to_string(d.global_batch);
  text += " --shuffle " + d.shuffle;
  if (d.shuffle == "batch") text += " --seed " + std::to_string(c.seed);
  return text;
}

}  // namespace

io::DataOrder Trainer::State::describe_data_order() const {
  io::DataOrder d;
  d.global_batch = options.global_batch;
  d.global_batch_tokens = options.global_batch_tokens;
  d.shuffle = options.shuffle;
  d.rows = reader->schema().rows;
  Fingerprint print;
  print.add(reader->schema().describe());
  const auto rows = reader->shard_rows();
  for (std::size_t s = 0; s < rows.size(); ++s) {
    d.files.push_back(basename_of(reader->paths()[s]));
    print.add(rows[s]);
  }
  // A few rows' values: the first, the last and two between (host staging, not counted).
  const memory::UncountedScope staging;
  const std::int64_t n = d.rows;
  for (const std::int64_t row : {std::int64_t{0}, n / 3, (2 * n) / 3, n - 1}) {
    const data::Batch one = reader->read(row, row + 1);
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

namespace {

// A checkpoint whose data or data order differs from this run's is refused: resumed so, the run
// would read some rows of the epoch twice and others never (--resume-reshape takes a new order
// from an epoch boundary on).
void refuse_order_change(const io::Checkpoint& c, const std::string& chosen,
                         const OrderChange& change, bool resume_reshape,
                         const data::DataSchema& schema) {
  const std::string head = "--resume: checkpoint '" + chosen + "' (step " + std::to_string(c.step) +
                           ") was written with " + change.what;
  if (change.kind == OrderChange::kData)
    throw CollectiveError(head +
                              ": resumed so, the run would read some rows of the epoch twice "
                              "and others never. Resume with the checkpoint's data, or start "
                              "a new run (another --checkpoint)",
                          ExitCode::kUsage, 0);
  if (change.kind == OrderChange::kOrder && !resume_reshape)
    throw CollectiveError(
        head +
            ": resumed so, the run would read some rows of the epoch twice and others never. "
            "Resume with the checkpoint's value, or add --resume-reshape (the change then "
            "starts at an epoch boundary), or start a new run (another --checkpoint)",
        ExitCode::kUsage, 0);
  if (change.kind == OrderChange::kOrder && c.data.batch_in_epoch != 0) {
    // The rest of the epoch exists only in the checkpoint's order (its batches are other
    // rows): finishing it takes the checkpoint's options up to the epoch's end.
    const std::int64_t end = c.step - c.data.batch_in_epoch + old_batches_per_epoch(c, schema);
    throw CollectiveError("--resume-reshape: checkpoint '" + chosen + "' (step " +
                              std::to_string(c.step) + ") is at batch " +
                              std::to_string(c.data.batch_in_epoch) + " of epoch " +
                              std::to_string(c.epoch) +
                              ", whose other rows are read only in its order; resume "
                              "first with " +
                              order_options(c) + " --steps " + std::to_string(end) +
                              " (the end of that epoch), then with --resume-reshape",
                          ExitCode::kUsage, 0);
  }
}

}  // namespace

void Trainer::State::resume() {
  if (!options.resume) return;
  if (options.checkpoint.empty())
    throw CollectiveError("--resume needs --checkpoint FILE", ExitCode::kUsage, 0);
  std::optional<io::LoadedCheckpoint> loaded = load_checkpoint();
  if (!loaded) {
    if (root && !options.quiet)
      std::cout << "no checkpoint at " << options.checkpoint << " yet: starting from step 0"
                << std::endl;
    return;
  }
  const std::string& chosen = loaded->path;
  // The same record on every rank: every rank reaches the same verdict without a word.
  const io::Checkpoint& c = loaded->checkpoint;
  const OrderChange change = data_order_change(c, data_order, options.seed);
  refuse_order_change(c, chosen, change, options.resume_reshape, reader->schema());
  reshaped = change.kind == OrderChange::kOrder;
  set_damaged_aside(*loaded);
  restore(c);
  checkpoint_step = step;
  // Epochs are counted from the checkpoint's epoch start (a reshaped run's is no multiple of
  // this run's batches per epoch); --epochs counts from there too.
  if (c.data.global_batch != 0) {
    epoch_origin_step = c.step - c.data.batch_in_epoch;
    epoch_origin = c.epoch;
    total_steps = std::max(steps_wanted(), step);
    schedule = make_schedule(options.lr, options.warmup_steps, total_steps, options.schedule);
  }
  if (reshaped && root && !options.quiet)
    std::cout << "autoaccum: --resume-reshape: epoch " << c.epoch << " (from step " << c.step
              << ") on reads every row once in the new order: " << change.what << std::endl;
}

// Rank 0 chooses which file to resume from and every rank reads that one: on a network file
// system with caching, ranks choosing alone could see different newest files. None: there is no
// checkpoint yet.
std::optional<io::LoadedCheckpoint> Trainer::State::load_checkpoint() {
  std::optional<io::LoadedCheckpoint> loaded;
  std::string chosen;
  // The file's tensors are host staging, outside --memory-limit (on a GPU they would be host
  // memory too): a small limit must not make a good checkpoint unreadable.
  comm::collectively(comm, [&] {
    if (!root) return;
    const memory::UncountedScope staging;
    loaded = io::read_latest_checkpoint(options.checkpoint);
    if (!loaded) return;
    chosen = loaded->path;
    resumed_from = chosen;
  });
  comm.broadcast(chosen, 0);
  comm::collectively(comm, [&] {
    if (root || chosen.empty()) return;
    const memory::UncountedScope staging;
    loaded = io::LoadedCheckpoint{io::read_checkpoint(chosen), chosen, {}};
  });
  if (chosen.empty()) return std::nullopt;
  loaded->path = chosen;
  return loaded;
}

// Rank 0: a damaged newer checkpoint is moved aside (kept for a look, never resumed from nor
// counted among the kept ones): the checkpoints written from here on are the newest. Then what
// was skipped, and why, for the user.
void Trainer::State::set_damaged_aside(const io::LoadedCheckpoint& loaded) {
  const io::Checkpoint& c = loaded.checkpoint;
  const std::string& chosen = loaded.path;
  if (root) {
    for (const auto& skipped : loaded.skipped) {
      resume_skipped.push_back(skipped.why);
      const std::string aside = skipped.path + ".damaged";
      if (!skipped.path.empty() && std::rename(skipped.path.c_str(), aside.c_str()) == 0)
        resume_skipped.back() += " (moved to " + aside + ")";
    }
  }
  if (root && !options.quiet) {
    for (const auto& skipped : resume_skipped)
      std::cout << "autoaccum: warning: --resume: skipped " << skipped << std::endl;
    if (!resume_skipped.empty())
      std::cout << "autoaccum: --resume: resuming from the newest whole checkpoint, " << chosen
                << " (step " << c.step << ")" << std::endl;
    if (!c.verified)
      std::cout << "autoaccum: note: " << chosen
                << " was written before checkpoints had checksums: read unverified" << std::endl;
  }
}

// A checkpoint's state, room by room: the model's (parameters, buffers, optimizer state, random
// streams; agreed, since any rank may find it does not match), then the step, the loss scale, the
// micro-batches, the memory and time models, and the balanced shares.
void Trainer::State::restore(const io::Checkpoint& c) {
  const std::string problem = restore_model(c);
  if (auto failure = comm::agree_on_failure(comm, problem)) comm::throw_collective(comm, *failure);
  step = c.step;
  loss_scale.restore(c.loss_scale, c.loss_scale_clean_steps);
  const std::vector<std::int64_t> saved = restore_micro_batches(c);
  restore_fits(c);
  restore_shares(c, saved);
}

// What in `c` does not fit this model ("" if all of it does).
std::string Trainer::State::restore_model(const io::Checkpoint& c) {
  std::string problem;
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : model->named_parameters()) {
    auto it = std::find_if(c.params.begin(), c.params.end(),
                           [&](const auto& p) { return p.first == name; });
    if (it == c.params.end() || it->second.numel() != tensor.numel()) {
      problem = "'" + options.checkpoint + "' does not match the model: parameter '" + name + "'";
      break;
    }
    tensor.copy_(it->second.view(tensor.sizes()));
  }
  for (auto& [name, tensor] : model->named_buffers()) {
    auto it = std::find_if(c.buffers.begin(), c.buffers.end(),
                           [&](const auto& p) { return p.first == name; });
    if (it != c.buffers.end() && it->second.numel() == tensor.numel())
      tensor.copy_(it->second.view(tensor.sizes()));
  }
  if (problem.empty()) {
    if (!c.optimizer_kind.empty()) {
      const std::string wrong = optimizer_checkpoint->load(c);
      if (!wrong.empty()) problem = "'" + options.checkpoint + "': " + wrong;
    } else if (sharded()) {
      problem = "'" + options.checkpoint +
                "' holds its optimizer state in LibTorch's archive (autoaccum before --shard): "
                "resume it once with --shard none, whose next checkpoint is written per "
                "parameter";
    } else {
      try {
        optimizer->load(c.optimizer, context.device);
      } catch (const c10::Error& e) {
        problem = "'" + options.checkpoint + "': optimizer state does not match: " + e.msg();
      }
    }
  }
  // Each rank continues its own random stream; a checkpoint of another world size (or one
  // written before streams were saved) gives fresh streams for this step.
  if (problem.empty()) {
    if (static_cast<int>(c.generator_states.size()) == world) {
      try {
        // A checkpoint written on the CPU holds no GPU stream: the GPU's starts afresh.
        model_state->set_generator_state(
            c.generator_states[static_cast<std::size_t>(rank)],
            rank_seed(options.seed ^ static_cast<std::uint64_t>(c.step), rank));
      } catch (const Error& e) {
        problem = "'" + options.checkpoint + "': " + e.what();
      }
    } else {
      seed_generators_for_rank(options.seed ^ static_cast<std::uint64_t>(c.step), rank);
    }
  }
  return problem;
}

// The micro-batch learned before. What fits on a rank depends on its memory and the model, not on
// how many ranks share the batch: on the same ranks each continues at its own size; on another
// number of ranks the sizes are kept where they were equal, and with per-rank sizes (which belong
// to ranks that may no longer exist) every rank starts from the largest and halves where it must.
// Capped by the new per-rank batch either way. Returns the sizes it continues at.
std::vector<std::int64_t> Trainer::State::restore_micro_batches(const io::Checkpoint& c) {
  std::vector<std::int64_t> saved = c.micro_batches;
  if (saved.empty() && c.micro_batch > 0) saved.push_back(c.micro_batch);
  std::string note;
  if (!saved.empty() && c.world_size != world) {
    const std::int64_t largest = *std::max_element(saved.begin(), saved.end());
    const bool equal =
        std::all_of(saved.begin(), saved.end(), [&](std::int64_t m) { return m == saved.front(); });
    note = "the checkpoint was written by " + std::to_string(c.world_size) + " rank(s); now " +
           std::to_string(world) + ": " +
           (equal ? "every rank keeps micro-batch " + std::to_string(largest)
                  : "per-rank micro-batches (" + sizes_text(saved) +
                        ") do not map onto other ranks: every rank starts at " +
                        std::to_string(largest) + " and halves where it runs out of memory") +
           (largest > size_cap
                ? " (capped at the new per-rank batch, " + std::to_string(size_cap) + ")"
                : "");
    saved = {largest};
  } else if (!saved.empty() && static_cast<int>(saved.size()) != world) {
    saved = {*std::max_element(saved.begin(), saved.end())};
  }
  make_micro_batches(saved);
  if (!note.empty()) reporter.note(note);
  return saved;
}

void Trainer::State::restore_fits(const io::Checkpoint& c) {
  // The memory models and the documents' width costs continue on the same ranks, so the resumed
  // run predicts, regrows and cuts documents as the interrupted one would have. On another
  // number of ranks they belong to ranks that may not exist: learned again from the attempts.
  if (c.world_size == world && static_cast<int>(c.memory_models.size()) == world &&
      memory_models.size() == c.memory_models.size()) {
    costs.width_costs.assign(static_cast<std::size_t>(world), data::WidthCost{});
    for (std::size_t r = 0; r < memory_models.size(); ++r) {
      const auto& m = c.memory_models[r];
      memory_models[r] = MemoryModel::from_record({m.points, m.failed_units, m.base});
      if (documents() && !fixed_size && options.token_cost_by_memory && m.width_ratio > 0)
        costs.width_costs[r] = data::WidthCost{m.width_ratio, size_floor};
    }
  }
  // --micro-batch-cost auto: the time fits continue on the same ranks, so the resumed run cuts as
  // the interrupted one did (no time probe); on another number of ranks they are probed again.
  if (c.world_size == world && static_cast<int>(c.time_fits.size()) == world && documents() &&
      options.micro_batch_cost == TrainOptions::MicroBatchCost::kAuto) {
    costs.time_fits.assign(static_cast<std::size_t>(world), std::nullopt);
    for (std::size_t r = 0; r < c.time_fits.size(); ++r) {
      const auto& f = c.time_fits[r];
      if (f.per_unit > 0) costs.time_fits[r] = TimeFit{f.fixed, f.per_unit, f.per_square};
    }
    time_pending = false;
  }
}

void Trainer::State::restore_shares(const io::Checkpoint& c,
                                    const std::vector<std::int64_t>& saved) {
  // Balanced shares continue on the same ranks; on another number they start even again.
  if (options.balance && balance->restore(step, c.shares, c.shares_after, c.shares_followed)) {
    // The recorded sizes follow the shares they last followed (the step before's, when a
    // change applies from this step; checkpoints older than shares_followed: taken to be this
    // step's). They follow again only when the shares change, as in the interrupted run (a
    // resumed run that followed them afresh would start from what its memory models say now,
    // not from the sizes it had). A size grown past the even share into a larger one is kept:
    // the share, not the even split, is its cap.
    if (!documents() && static_cast<int>(saved.size()) == world)
      micro_batches->resume_shares(balance->followed(), saved);
  } else if (options.balance && !c.shares.empty()) {
    reporter.note("the checkpoint's balanced shares (" + sizes_text(c.shares) +
                  ") were for another number of ranks or global batch: the ranks start "
                  "from an even split and balance again");
  }
}

// Each rank's generator state, gathered on every rank (fixed-size blocks with a length).
std::vector<std::string> Trainer::State::gather_generator_states() {
  const std::string mine = model_state->generator_state();
  const auto block =
      static_cast<std::size_t>(comm.allreduce_max(static_cast<std::int64_t>(mine.size()))) +
      sizeof(std::uint64_t);
  std::vector<char> own(block, '\0');
  const std::uint64_t length = mine.size();
  std::memcpy(own.data(), &length, sizeof length);
  std::memcpy(own.data() + sizeof length, mine.data(), mine.size());
  std::vector<char> all(block * static_cast<std::size_t>(world));
  comm.allgather(own.data(), block, all.data());
  std::vector<std::string> states;
  for (int r = 0; r < world; ++r) {
    const char* at = all.data() + block * static_cast<std::size_t>(r);
    std::uint64_t n = 0;
    std::memcpy(&n, at, sizeof n);
    states.emplace_back(at + sizeof n, static_cast<std::size_t>(n));
  }
  return states;
}

// This rank's parameters, hashed: every rank's, gathered, say whether the replicas are still
// equal, bit for bit (a decision taken differently on one rank would show here).
std::vector<std::string> Trainer::State::gather_replica_fingerprints() {
  Fingerprint print;
  for (const at::Tensor& p : model->parameters()) {
    const at::Tensor host = p.detach().to(at::kCPU).contiguous();
    print.add(host.data_ptr(), static_cast<std::size_t>(host.nbytes()));
  }
  std::uint64_t mine = print.value;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world));
  comm.allgather(&mine, sizeof mine, all.data());
  std::vector<std::string> fingerprints;
  std::vector<int> differ;
  for (int r = 0; r < world; ++r) {
    Fingerprint one;
    one.value = all[static_cast<std::size_t>(r)];
    fingerprints.push_back(one.hex());
    if (all[static_cast<std::size_t>(r)] != all.front()) differ.push_back(r);
  }
  if (!differ.empty() && !replicas_differ_said && root) {
    replicas_differ_said = true;
    core::write_line(stderr,
                     "autoaccum: warning: at step " + std::to_string(step) +
                         " the parameters of rank(s) " +
                         sizes_text(std::vector<std::int64_t>(differ.begin(), differ.end())) +
                         " differ from rank 0's: the replicas drifted apart (the "
                         "checkpoint holds rank 0's; please report it)");
  }
  return fingerprints;
}

void Trainer::State::save_checkpoint() {
  if (options.checkpoint.empty()) return;
  std::vector<std::string> generators = gather_generator_states();
  std::vector<std::string> fingerprints = gather_replica_fingerprints();
  // Parameters and buffers are identical on every rank, so rank 0 writes; the others learn how
  // it went.
  const auto start = std::chrono::steady_clock::now();
  std::int64_t bytes = 0;
  comm::collectively(comm, [&] {
    if (!root) {
      optimizer_checkpoint->finish_exchange();  // --shard optimizer: each owner's pieces
      return;
    }
    try {
      bytes = write_checkpoint_file(std::move(generators), std::move(fingerprints));
    } catch (...) {
      optimizer_checkpoint->finish_exchange();  // the others are waiting for those pieces
      throw;
    }
    optimizer_checkpoint->finish_exchange();
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  checkpoint_step = step;
  reporter.notify([&](StepObserver& o) { o.on_checkpoint(step, bytes, seconds); });
}

std::int64_t Trainer::State::write_checkpoint_file(std::vector<std::string> generators,
                                                   std::vector<std::string> fingerprints) {
  io::Checkpoint c;
  c.step = step;
  c.epoch = position(step).epoch;
  c.micro_batch = micro_batches->current(0);
  c.micro_batches = micro_batches->sizes();
  if (options.balance) {
    c.shares = balance->shares(step);
    c.shares_after = balance->shares(step + 1);
    if (sizes_follow_shares()) c.shares_followed = balance->followed();
  }
  for (std::size_t r = 0; r < memory_models.size(); ++r) {
    const MemoryModel::Record m = memory_models[r].record();
    c.memory_models.push_back(
        {m.points, m.failed_units, m.base, costs.width_cost(static_cast<int>(r)).ratio});
  }
  for (const auto& fit : costs.time_fits)
    c.time_fits.push_back(
        fit ? io::Checkpoint::TimeFitRecord{fit->fixed, fit->per_unit, fit->per_square}
            : io::Checkpoint::TimeFitRecord{});
  c.world_size = world;
  c.seed = options.seed;
  c.data = data_order;
  c.data.batch_in_epoch = position(step).batch;
  if (loss_scale.enabled()) {
    c.loss_scale = loss_scale.value();
    c.loss_scale_clean_steps = loss_scale.clean_steps();
  }
  // Where they are: the writer copies from a GPU in bounded pieces, and streams the
  // optimizer's state as LibTorch serializes it (never whole in host memory).
  c.params = model->named_parameters();
  c.buffers = model->named_buffers();
  c.optimizer_kind = optimizer->kind();
  c.optimizer_step = optimizer->step_count();
  c.streamed_optimizer = optimizer_checkpoint->tensors();
  c.generator_states = std::move(generators);
  c.replica_fingerprints = std::move(fingerprints);
  return io::write_checkpoint(options.checkpoint, c, static_cast<int>(options.keep_checkpoints));
}

}  // namespace autoaccum::train
