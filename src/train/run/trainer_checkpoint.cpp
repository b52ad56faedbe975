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

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/console.hpp"
#include "autoaccum/core/fingerprint.hpp"
#include "run_state.hpp"

namespace autoaccum::train {
namespace {

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

// The parameter `name` of `c` into the model's `tensor`: from the file where it was left there
// (straight into the tensor's memory, or in pieces), else from the copy read; false when `c` has
// none of that name and size.
bool restore_parameter(const io::Checkpoint& c, const std::string& name, at::Tensor& tensor) {
  const auto stored = std::find_if(c.stored_params.begin(), c.stored_params.end(),
                                   [&](const auto& p) { return p.name == name; });
  if (stored != c.stored_params.end()) {
    if (stored->numel() != tensor.numel()) return false;
    if (tensor.is_contiguous()) {
      io::read_stored(*stored, 0, tensor.view(-1));
    } else {
      at::Tensor whole = at::empty({tensor.numel()}, tensor.options());
      io::read_stored(*stored, 0, whole);
      tensor.copy_(whole.view(tensor.sizes()));
    }
    return true;
  }
  const auto read = std::find_if(c.params.begin(), c.params.end(),
                                 [&](const auto& p) { return p.first == name; });
  if (read == c.params.end() || read->second.numel() != tensor.numel()) return false;
  tensor.copy_(read->second.view(tensor.sizes()));
  return true;
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
  const OrderChange change = data_order_change(c, feed.order(), options.seed);
  refuse_order_change(c, chosen, change, options.resume_reshape, feed.reader().schema());
  if (change.kind == OrderChange::kOrder) feed.set_reshaped();
  set_damaged_aside(*loaded);
  restore(c);
  checkpoint_step = step;
  // Epochs are counted from the checkpoint's epoch start (a reshaped run's is no multiple of
  // this run's batches per epoch); --epochs counts from there too.
  if (c.data.global_batch != 0) {
    feed.resume_at(step, c.step - c.data.batch_in_epoch, c.epoch);
    schedule =
        make_schedule(options.lr, options.warmup_steps, feed.total_steps(), options.schedule);
  }
  if (feed.reshaped() && root && !options.quiet)
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
    loaded = io::read_latest_checkpoint(options.checkpoint, io::Parameters::kInFile);
    if (!loaded) return;
    chosen = loaded->path;
    resumed_from = chosen;
  });
  comm.broadcast(chosen, 0);
  comm::collectively(comm, [&] {
    if (root || chosen.empty()) return;
    const memory::UncountedScope staging;
    loaded = io::LoadedCheckpoint{
        io::read_checkpoint(chosen, io::Checksums::kOn, io::Parameters::kInFile), chosen, {}};
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
  std::string problem;
  try {  // the tensors left in the file are read here: a failure is this rank's to report
    problem = restore_model(c);
  } catch (const std::exception& e) {
    problem = "'" + options.checkpoint + "' could not be read: " + e.what();
  }
  if (auto failure = comm::agree_on_failure(comm, problem)) comm::throw_collective(comm, *failure);
  step = c.step;
  loss_scale.restore(c.loss_scale, c.loss_scale_clean_steps);
  std::string note;
  const std::vector<std::int64_t> saved = sizing.restore_sizes(c, note);
  if (!note.empty()) reporter.note(note);
  sizing.restore_fits(c);
  restore_shares(c, saved);
}

// What in `c` does not fit this model ("" if all of it does).
std::string Trainer::State::restore_model(const io::Checkpoint& c) {
  std::string problem;
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : bundle->model().named_parameters()) {
    if (!restore_parameter(c, name, tensor)) {
      problem = "'" + options.checkpoint + "' does not match the model: parameter '" + name + "'";
      break;
    }
  }
  for (auto& [name, tensor] : bundle->model().named_buffers()) {
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
        bundle->state().set_generator_state(
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

void Trainer::State::restore_shares(const io::Checkpoint& c,
                                    const std::vector<std::int64_t>& saved) {
  // Balanced shares continue on the same ranks, and sizes that followed them follow them again
  // (Sizing::resume_shares); on another number of ranks they start even again.
  if (options.balance &&
      feed.balance().restore(step, c.shares, c.shares_after, c.shares_followed)) {
    sizing.resume_shares(saved);
  } else if (options.balance && !c.shares.empty()) {
    reporter.note("the checkpoint's balanced shares (" + sizes_text(c.shares) +
                  ") were for another number of ranks or global batch: the ranks start "
                  "from an even split and balance again");
  }
}

// Each rank's generator state, gathered on every rank (fixed-size blocks with a length).
std::vector<std::string> Trainer::State::gather_generator_states() {
  const std::string mine = bundle->state().generator_state();
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
  for (const at::Tensor& p : bundle->model().parameters()) {
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
  c.epoch = feed.position(step).epoch;
  if (options.balance) {
    c.shares = feed.balance().shares(step);
    c.shares_after = feed.balance().shares(step + 1);
  }
  sizing.record(c);
  c.world_size = world;
  c.seed = options.seed;
  c.data = feed.order();
  c.data.batch_in_epoch = feed.position(step).batch;
  if (loss_scale.enabled()) {
    c.loss_scale = loss_scale.value();
    c.loss_scale_clean_steps = loss_scale.clean_steps();
  }
  // Where they are: the writer copies from a GPU in bounded pieces, and streams the
  // optimizer's state as LibTorch serializes it (never whole in host memory).
  c.params = bundle->model().named_parameters();
  c.buffers = bundle->model().named_buffers();
  c.optimizer_kind = optimizer->kind();
  c.optimizer_step = optimizer->step_count();
  c.streamed_optimizer = optimizer_checkpoint->tensors();
  c.generator_states = std::move(generators);
  c.replica_fingerprints = std::move(fingerprints);
  return io::write_checkpoint(options.checkpoint, c, static_cast<int>(options.keep_checkpoints));
}

}  // namespace autoaccum::train
