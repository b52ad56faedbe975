// Trainer: the step loop. Read a slab, attempt it in micro-batches, reduce once, agree, then
// step or retry; observers, checkpoints and evaluation hang off the loop (docs/design.md).
#include "autoaccum/train/trainer.hpp"

#include <sched.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <iomanip>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/factory.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/console.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/core/output_lock.hpp"
#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/prefetcher.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/balance.hpp"
#include "autoaccum/train/evaluation.hpp"
#include "autoaccum/train/micro_batch.hpp"
#include "autoaccum/train/model_state.hpp"
#include "autoaccum/train/objective.hpp"
#include "autoaccum/train/observers.hpp"
#include "autoaccum/train/optimizer_step.hpp"
#include "autoaccum/train/reduce_buffer.hpp"
#include "autoaccum/train/schedule.hpp"
#include "autoaccum/train/step_agreement.hpp"

#include "trainer_state.hpp"

namespace autoaccum::train {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

std::string hostname() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGUSR1, SIGTERM, SIGINT})
    sigaction(signal, &action, nullptr);
}
bool stop_requested() noexcept {
  return g_stop.load();
}
void request_stop() noexcept {
  g_stop.store(true);
}

ThreadChoice choose_threads(int requested, int local_ranks) {
  if (requested > 0) return {requested, "--threads"};
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    const int allowed = CPU_COUNT(&mask);
    if (allowed > 0 && allowed < cores) {
      return {allowed, "CPU mask of " + std::to_string(allowed) + " core(s)"};
    }
  }
  const int ranks = std::max(1, local_ranks);
  return {std::max(1, cores / ranks),
          std::to_string(cores) + " cores / " + std::to_string(ranks) + " rank(s) on the node"};
}

void Trainer::State::setup() {
  rank = comm.rank();
  world = comm.size();
  root = rank == 0;
  loss_scale = LossScale(options.precision == Precision::kFp16);
  options.memory_limit = limit_of(rank);  // --memory-limit A,B,...: this rank's item
  for (const auto& slow : options.inject_slow) {
    if (slow.rank == rank) slow_factor = slow.factor;
  }
  control = ControlLayout{world};
  const ThreadChoice threads = choose_threads(options.threads, comm.local_size());
  thread_source = threads.source;
  at::set_num_threads(threads.count);
  memory::tune_malloc();

  choose_device();
  take_outputs();  // before anything is written, so a second job on them is refused at once
  open_data();
  build_model();
  trial();
  allocate_step_state();
  seed_generators_for_rank(options.seed, rank);
  resume();
  open_observers();
  announce();
}

void Trainer::State::choose_device() {
  const auto& o = options;
  // "auto" is CUDA only when every rank sees a GPU. The GPU is chosen by the node-local rank
  // among the visible ones (the NCCL communicator picks the same one); --memory-limit then
  // caps the CUDA caching allocator.
  const int gpus = memory::cuda_device_count();
  const bool gpus_everywhere = comm.allreduce_min(gpus > 0 ? 1 : 0) == 1;
  comm::collectively(comm, [&] {
    if (o.device != "cuda") return;
    if (!memory::cuda_built()) {
      throw UsageError(
          "--device cuda: this build has no CUDA support (it needs a LibTorch built "
          "with CUDA; see docs/gpu.md)");
    }
    if (gpus == 0) throw UsageError("--device cuda: rank " + std::to_string(rank) + " sees no GPU");
  });
  context.use_cuda = o.device == "cuda" || (o.device == "auto" && gpus_everywhere);
  comm::collectively(comm, [&] {
    const std::string problem = precision_problem(
        o.precision, context.use_cuda ? c10::Device(c10::kCUDA) : c10::Device(c10::kCPU));
    if (!problem.empty()) throw UsageError(problem);
  });
  // The precision probe's few MiB come and go before --memory-limit applies to the CPU.
  memory::install_cpu_budget(0);
  if (!context.use_cuda) probe_precision();
  // On CUDA, host tensors are still counted, never limited; the limit is the GPU's.
  memory::install_cpu_budget(context.use_cuda ? 0 : o.memory_limit);
  if (context.use_cuda) {
    const int index = comm.local_rank() % gpus;
    context.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    comm::collectively(comm, [&] { memory::use_cuda_device(index, o.memory_limit); });
    probe_precision();
  }
}

void Trainer::State::take_outputs() {
  // Rank 0 writes both; a live job holding either refuses this one, and a dead one's lock is
  // taken over with a warning.
  comm::collectively(comm, [&] {
    if (!root) return;
    if (!options.run_log.empty()) check_writable_file("--run-log", options.run_log);
    if (!options.checkpoint.empty()) check_writable_file("--checkpoint", options.checkpoint);
    if (!options.run_log.empty())
      locks.push_back(std::make_unique<OutputLock>("--run-log", options.run_log));
    if (!options.checkpoint.empty() && options.checkpoint != options.run_log)
      locks.push_back(std::make_unique<OutputLock>("--checkpoint", options.checkpoint));
  });
  for (const auto& lock : locks) {
    if (!lock->warning().empty() && !options.quiet)
      core::write_line(stderr, "autoaccum: warning: " + lock->warning());
  }
  // Holding the locks, no other writer exists: temporaries beside the outputs are a killed
  // writer's leftovers.
  if (root) {
    for (const std::string* output : {&options.run_log, &options.checkpoint}) {
      if (output->empty()) continue;
      for (const auto& removed : remove_stale_temporaries(*output)) {
        if (!options.quiet)
          core::write_line(stderr,
                           "autoaccum: note: removed " + removed + ", left by a killed writer");
      }
    }
  }
}

void Trainer::State::open_data() {
  const auto& o = options;
  comm::collectively(comm, [&] {
    reader = std::make_unique<data::SlabReader>(data::expand_data_paths(o.data), o.inputs,
                                                o.targets, true, o.ignore_index);
    const auto& schema = reader->schema();
    const bool classification = schema.target().type == data::FieldType::kInt64;
    objective.emplace(Objective::choose(o.loss, schema.target(),
                                        classification ? *schema.num_classes : 0, o.ignore_index));
    if (!o.val_data.empty()) {
      val_reader =
          std::make_unique<data::SlabReader>(data::expand_data_paths(o.val_data, "--val-data"),
                                             o.inputs, o.targets, true, o.ignore_index);
      const auto& a = reader->schema();
      const auto& b = val_reader->schema();
      for (std::size_t i = 0; i < a.fields.size(); ++i) {
        if (a.fields[i].type != b.fields[i].type ||
            a.fields[i].row_shape != b.fields[i].row_shape) {
          throw InputError(
              "--val-data '" + val_reader->paths().front() + "': dataset '" + b.fields[i].name +
              "' is " + data::to_string(b.fields[i].type) + " " +
              shape_text(b.fields[i].row_shape) + " per row, but the training data's is " +
              data::to_string(a.fields[i].type) + " " + shape_text(a.fields[i].row_shape));
        }
      }
      // Checked now, not in the final evaluation after hours of training.
      if (classification && b.max_label && *b.max_label >= objective->classes()) {
        throw InputError("--val-data '" + val_reader->paths().front() + "': dataset '" + o.targets +
                         "' has label " + std::to_string(*b.max_label) +
                         ", outside the training data's " + std::to_string(objective->classes()) +
                         " classes [0, " + std::to_string(objective->classes()) + ")");
      }
    }
    plan = std::make_unique<data::BatchPlan>(schema.rows, o.global_batch, world,
                                             data::parse_shuffle(o.shuffle), o.seed);
    if (o.steps < 0 || o.epochs < 0) throw UsageError("--steps and --epochs must not be negative");
    total_steps =
        o.steps > 0
            ? o.steps
            : static_cast<std::int64_t>(o.epochs * static_cast<double>(plan->batches_per_epoch()));
    if (total_steps < 1)
      throw UsageError("nothing to do: give --steps N or --epochs E (E * batches per epoch >= 1)");
    shares = std::make_unique<ShareSchedule>(even_shares(o.global_batch, world));
    if (o.balance && o.micro_batch && *o.micro_batch * world > o.global_batch) {
      throw UsageError("--balance throughput keeps every rank at least its micro-batch, but " +
                       std::to_string(world) + " ranks x --micro-batch " +
                       std::to_string(*o.micro_batch) + " is more than --global-batch " +
                       std::to_string(o.global_batch) +
                       ": lower --micro-batch or use --micro-batch auto");
    }
    micro_batches = std::make_unique<RankMicroBatches>(
        world, plan->max_rank_rows(), o.micro_batch, std::vector<std::int64_t>{},
        o.refine_micro_batch, o.micro_batch_per_rank);
    schedule = make_schedule(o.lr, o.warmup_steps, total_steps, o.schedule);
    if (o.lr <= 0 || !std::isfinite(o.lr)) throw UsageError("--lr must be positive");
  });
}

void Trainer::State::build_model() {
  const auto& o = options;
  comm::collectively(comm, [&] {
    const auto& schema = reader->schema();
    ModelSpec spec;
    spec.kind = o.model;
    spec.hidden = o.hidden;
    spec.file = o.model_file;
    spec.input_shape = schema.fields.front().row_shape;
    spec.outputs = objective->classification() ? objective->classes() : [&] {
      std::int64_t n = 1;
      for (auto d : schema.target().row_shape)
        n *= d;
      return n;
    }();
    torch::manual_seed(o.seed);  // the same initial parameters on every rank
    model = make_model(spec);
  });
  // Rank 0's initial parameters and buffers everywhere (equal by seeding or by the file; this
  // makes it certain). Broadcast on the host, before the model moves to its device.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      comm.broadcast(p.data_ptr(), static_cast<std::size_t>(p.nbytes()), 0);
  }
  if (context.use_cuda) {
    comm::collectively(comm, [&] {
      model->to(context.device);
      reader->set_pinned(true);
      if (val_reader) val_reader->set_pinned(true);
    });
    // The gradient communicator for device buffers (--backend auto: NCCL), bootstrapped over
    // MPI; every rank builds it, or every rank learns why not.
    comm::collectively(comm, [&] {
      context.gradient_comm =
          comm::make_communicator(comm::parse_backend(options.backend), comm::MemoryKind::kDevice);
      if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(context.gradient_comm.get()))
        nccl->set_compute_stream(memory::current_cuda_stream());
    });
  }
  // A file saved after model.eval() would otherwise train with dropout off and BatchNorm frozen.
  model->set_training(true);
  parameters = model->parameter_set();
  comm::collectively(comm,
                     [&] { model_state = std::make_unique<ModelState>(*model, context.device); });
}

// This rank's rows of step `global_step`: its part of that step's global batch under the split
// the schedule gives for the step (even, or balanced by speed).
data::Batch Trainer::State::read_rank_rows(std::int64_t global_step) const {
  const std::int64_t per_epoch = plan->batches_per_epoch();
  const memory::UncountedScope staging;  // host staging, as pinned memory on a GPU
  const data::RowRange batch = plan->batch_rows(global_step / per_epoch, global_step % per_epoch);
  const auto offsets = shares->offsets(global_step);
  const auto r = static_cast<std::size_t>(rank);
  return reader->read(batch.begin + offsets[r], batch.begin + offsets[r + 1]);
}

// One forward and loss on this rank's first rows, in eval mode and without gradients, so that
// a model that cannot take the data fails here with one line, not at step 0 with a traceback
// per rank. Buffers and random state are restored: the trial leaves no trace.
void Trainer::State::trial() {
  comm::collectively(comm, [&] {
    const std::int64_t per_epoch = plan->batches_per_epoch();
    const data::RowRange part = plan->rank_rows(0, 0 % per_epoch, rank);
    if (part.size() < 1) return;
    data::Batch rows = [&] {
      const memory::UncountedScope staging;
      return reader->read(part.begin, std::min(part.end, part.begin + 2));
    }();
    const auto& schema = reader->schema();
    std::ostringstream what;
    what << model_name() << " on --data '" << reader->paths().front() << "' (";
    for (std::size_t i = 0; i + 1 < rows.size(); ++i) {
      const at::Tensor& t = rows[i];
      std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
      what << (i ? ", " : "") << schema.fields[i].name << " " << shape_text(shape) << " "
           << t.scalar_type();
    }
    what << "): ";
    AttemptGuard guard(*model_state);  // never committed
    torch::NoGradGuard no_grad;
    model->set_training(false);  // one row must do: BatchNorm1d cannot take it in train mode
    struct TrainAgain {
      Model& model;
      ~TrainAgain() { model.set_training(true); }
    } train_again{*model};
    memory::OomWatch watch;
    try {
      std::vector<at::Tensor> inputs;
      for (std::size_t i = 0; i + 1 < rows.size(); ++i)
        inputs.push_back(context.on_device(rows[i]));
      const at::Tensor target = context.on_device(rows[rows.size() - 1]);
      const AutocastScope autocast(options.precision, context.device.type());
      if (objective->from_model()) {
        (void)model->forward_loss(inputs, target).first.item<double>();
      } else {
        const at::Tensor output = model->forward(inputs);
        const std::string problem = objective->check_output(output, rows.rows(), options.targets);
        if (!problem.empty()) throw InputError(problem);
        (void)objective->terms(output, target).sum.item<double>();
      }
    } catch (const InputError& e) {
      throw InputError(what.str() + e.what());
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (watch.explains(e)) {
        throw Error("the model does not fit in memory (limit " + limit_text() +
                        ") even for the setup trial's " + std::to_string(rows.rows()) + " rows",
                    ExitCode::kOutOfMemory);
      }
      const std::string hint = objective->from_model()
                                   ? "--loss model calls forward(inputs..., targets) and needs "
                                     "(loss_sum, weight) back: "
                                   : "";
      throw InputError(what.str() + hint + torch_error_summary(e));
    }
  });
}

// The reduce buffer, the gradient views and the optimizer state, allocated once: a model that
// cannot hold them fails here, with exit code 3, not inside a step.
void Trainer::State::allocate_step_state() {
  comm::collectively(comm, [&] {
    memory::OomWatch watch;
    try {
      ReduceLayout layout;
      gradient_region = layout.add("gradients", parameters.trainable_elements);
      buffer_region = layout.add("buffers", model_state->reduce_count());
      control_region = layout.add("control", control.count());
      reduce = std::make_unique<ReduceBuffer>(std::move(layout), context.device);
      reduce->bind_gradients(parameters.trainable, gradient_region);
      optimizer = std::make_unique<OptimizerStep>(options, parameters.trainable);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      if (!watch.explains(e)) throw;
      throw Error(
          "the model's parameters, gradients and optimizer state do not fit in memory "
          "(limit " +
              limit_text() + "); raise --memory-limit or use a smaller model",
          ExitCode::kOutOfMemory);
    }
  });
  control_values.assign(static_cast<std::size_t>(control.count()), 0.0f);
  if (context.gradient_comm) {
    // NCCL allocates its device buffers at the first collective. One all-reduce of the whole
    // (zero) buffer now takes them before the search fills the cache, and a GPU too full even
    // for them stops here with an out-of-memory message, before the first step.
    comm::collectively(comm, [&] {
      reduce->all().zero_();
      reduce_comm().allreduce_sum(reduce->all().data_ptr<float>(),
                                  static_cast<std::size_t>(reduce->all().numel()));
    });
  }
}

void Trainer::State::probe_precision() {
  if (!root) return;
  lower_gemm_speedup =
      gemm_speedup(autocast_dtype_for(
                       options.precision == Precision::kFp32 ? Precision::kBf16 : options.precision,
                       context.device.type()),
                   context.device);
}

void Trainer::State::open_observers() {
  // Host names for the run log, gathered once.
  std::vector<char> names(static_cast<std::size_t>(world) * 64, '\0');
  const std::string mine = hostname().substr(0, 63);
  std::vector<char> own(64, '\0');
  std::copy(mine.begin(), mine.end(), own.begin());
  comm.allgather(own.data(), 64, names.data());
  for (int r = 0; r < world; ++r)
    hostnames.emplace_back(names.data() + r * 64);
  peak_bytes.assign(static_cast<std::size_t>(world), 0);

  if (!options.run_log.empty()) {
    comm::collectively(comm, [&] {
      if (!root) return;
      if (options.resume && step > 0 && access(options.run_log.c_str(), F_OK) == 0) {
        observers.push_back(std::make_unique<RunLogObserver>(
            io::RunLogWriter::append(options.run_log, step, hostnames), options.log_flush_every));
        return;
      }
      io::RunLogHeader header;
      header.world_size = world;
      header.global_batch = options.global_batch;
      header.micro_batch_mode = micro_batches->automatic() ? "auto" : "fixed";
      header.command_line = options.command_line;
      header.started_at = io::utc_now();
      header.hostnames = hostnames;
      header.text = {
          {"model", model->describe()},
          {"loss", objective->describe()},
          {"optimizer", options.optimizer},
          {"schedule", options.schedule},
          {"data", reader->paths().front() +
                       (reader->paths().size() > 1
                            ? " (+" + std::to_string(reader->paths().size() - 1) + " shards)"
                            : "")},
          {"memory_limit", memory_limit_text()},
          {"micro_batch_scope", micro_batches->per_rank() ? "rank" : "global"},
          {"balance", balance_text()},
          {"precision", to_string(options.precision)}};
      header.numbers = {
          {"lr", options.lr},
          {"memory_limit_bytes", static_cast<double>(options.memory_limit)},
          {"total_steps", static_cast<double>(total_steps)},
          {"parameters", static_cast<double>(parameters.trainable_elements)},
          {"frozen_parameters", static_cast<double>(parameters.frozen_elements)},
          {"shared_parameters", static_cast<double>(parameters.shared_elements)},
          {"averaged_buffer_values", static_cast<double>(model_state->reduce_count())},
          {"threads_per_rank", static_cast<double>(at::get_num_threads())},
          {"lower_precision_gemm_speedup", lower_gemm_speedup}};
      observers.push_back(std::make_unique<RunLogObserver>(
          io::RunLogWriter::create(options.run_log, header), options.log_flush_every));
    });
  }
  if (root && !options.quiet) {
    observers.push_back(std::make_unique<ProgressObserver>(options.log_every, step, total_steps,
                                                           options.global_batch));
  }
}

void Trainer::State::announce() {
  std::vector<std::string> unique(hostnames);
  std::sort(unique.begin(), unique.end());
  const auto nodes = std::unique(unique.begin(), unique.end()) - unique.begin();
  std::ostringstream banner;
  banner << "autoaccum: " << world << " rank(s) on " << nodes << " node(s), "
         << at::get_num_threads() << " thread(s) per rank (" << thread_source << "); "
         << model->describe() << ": " << parameters.describe();
  if (model_state->reduce_count() > 0) {
    banner << "; " << model_state->reduce_count()
           << " buffer value(s) averaged over the ranks every step";
  }
  banner << "\nautoaccum: loss: " << objective->describe()
         << "\nautoaccum: " << reader->schema().rows << " rows, global batch "
         << options.global_batch << " (" << plan->batches_per_epoch() << " batches per epoch), "
         << total_steps << " steps; micro-batch " << (micro_batches->automatic() ? "auto" : "fixed")
         << (micro_batches->per_rank() ? " per rank" : "")
         << (micro_batches->automatic() ? ", starting at " : " at ") << micro_batches->describe()
         << "; memory limit " << memory_limit_text()
         << (options.memory_limits.empty() && options.memory_limit > 0 ? " per rank" : "");
  const char* lower = options.precision == Precision::kFp16 ? "fp16" : "bf16";
  std::ostringstream speedup;
  speedup << std::fixed << std::setprecision(1) << lower_gemm_speedup << "x";
  const std::string where = context.use_cuda ? "this GPU's " : "this CPU's ";
  if (options.precision == Precision::kFp32) {
    banner << "\nautoaccum: precision fp32";
    if (lower_gemm_speedup >= 1.5) {
      banner << " (" << where << "bf16 matrix products run " << speedup.str()
             << " as fast: --precision bf16 may train faster)";
    }
  } else {
    banner << "\nautoaccum: precision " << to_string(options.precision)
           << ": forward and loss under autocast, parameters and gradients fp32; " << where << lower
           << " matrix products run " << speedup.str() << " as fast as fp32's"
           << (lower_gemm_speedup < 1.5 ? " (no fast " + std::string(lower) +
                                              " here: expect little speed-up, only memory)"
                                        : std::string());
    if (loss_scale.enabled()) {
      banner << "\nautoaccum: fp16 loss scale " << loss_scale.value()
             << ", halved on every rank when the gradients overflow, doubled after "
             << LossScale::kGrowthInterval << " clean steps";
      if (!context.use_cuda)
        banner << " (AUTOACCUM_FP16_ON_CPU: products in bf16 on this CPU; for tests)";
    }
  }
  if (options.balance) banner << "\nautoaccum: balance: " << balance_text();
  for (const auto& slow : options.inject_slow) {
    banner << "\nautoaccum: drill: rank " << slow.rank << " made " << slow.factor
           << "x slower per row (--inject-slow)";
  }
  if (step > 0)
    banner << "\nautoaccum: resumed at step " << step << " with micro-batch "
           << micro_batches->describe();
  say(banner.str());
  for (const auto& line : say_later)
    say("note: " + line);
  say_later.clear();
}

// One attempt at the current batch with micro-batch m. Every rank returns the same outcome: it
// comes from the reduced buffer. A failed attempt leaves buffers and random state as they were.
StepOutcome Trainer::State::attempt(const data::Batch& slab, std::int64_t m) {
  reduce->zero();
  std::fill(control_values.begin(), control_values.end(), 0.0f);
  const auto input_count = static_cast<std::size_t>(slab.size() - 1);
  // The summed loss stays a tensor until after the all-reduce: no host synchronisation per
  // micro-batch (it matters on a GPU).
  at::Tensor local_loss, local_weight;
  memory::reset_peak();
  const auto compute_start = Clock::now();
  memory::OomWatch watch;
  std::optional<AttemptGuard> guard;
  bool out_of_memory = false;
  bool abandoned = false;
  AttemptPhase phase = AttemptPhase::kBuffers;
  try {
    guard.emplace(*model_state);
    // Lower precision: each weight cast once for all the attempt's micro-batches.
    const CastCacheScope casts(options.precision);
    for (std::int64_t offset = 0; offset < slab.rows(); offset += m) {
      // A stop signal ends the attempt between micro-batches, so a long step cannot outlast a
      // scheduler's grace time; the ranks agree at the collective below to drop the step.
      if (stop_requested()) {
        abandoned = true;
        break;
      }
      const auto micro_start = Clock::now();
      const data::Batch micro = slab.slice(offset, m);
      std::vector<at::Tensor> inputs;
      for (std::size_t i = 0; i < input_count; ++i)
        inputs.push_back(context.on_device(micro[i]));
      phase = AttemptPhase::kForward;
      const at::Tensor target = context.on_device(micro[input_count]);
      // The gradient of the summed loss accumulates; it is divided once, after the all-reduce,
      // by what the whole global batch counted.
      Objective::Terms terms;
      {
        // --precision: forward and loss under autocast; backward outside it, as in PyTorch.
        const AutocastScope autocast(options.precision, context.device.type());
        at::Tensor output;
        if (objective->from_model())
          std::tie(terms.sum, terms.weight) = model->forward_loss(inputs, target);
        else
          output = model->forward(inputs);
        // Injected after the forward pass, so the activations exist when it throws, as in a
        // real OOM late in forward; they must be released like a real one's.
        if (std::any_of(options.inject_oom.begin(), options.inject_oom.end(),
                        [&](const auto& i) { return i.fires(rank, micro.rows(), step); })) {
          memory::throw_out_of_memory("injected out-of-memory (--inject-oom) at micro-batch " +
                                      std::to_string(micro.rows()));
        }
        if (!objective->from_model()) {
          phase = AttemptPhase::kLoss;
          terms = objective->terms(output, target);
        }
      }
      phase = AttemptPhase::kBackward;
      at::Tensor scaled = terms.sum;
      if (loss_scale.enabled()) scaled = scaled * loss_scale.value();
      if (offset == 0 &&
          std::any_of(options.inject_overflow.begin(), options.inject_overflow.end(),
                      [&](const auto& i) { return i.rank == rank && i.step == step; }))
        scaled = scaled * std::numeric_limits<double>::infinity();  // --inject-overflow
      scaled.backward();
      local_loss = local_loss.defined() ? local_loss + terms.sum.detach() : terms.sum.detach();
      local_weight = local_weight.defined() ? local_weight + terms.weight : terms.weight;
      if (slow_factor != 1.0) {
        // --inject-slow: as if this rank's hardware were `slow_factor` times slower per row.
        std::this_thread::sleep_for(
            std::chrono::duration<double>((slow_factor - 1.0) * seconds_since(micro_start)));
      }
      if (!checked_views) {
        if (!reduce->gradients_intact()) throw Error("internal: autograd replaced a gradient view");
        checked_views = true;
      }
    }
    if (!abandoned) {
      phase = AttemptPhase::kBuffers;
      model_state->write_changes(reduce->view(buffer_region));
    }
    phase = AttemptPhase::kNone;
  } catch (const std::exception& e) {
    // Only an OOM is agreed on here; anything else is this rank's own failure (spmd_main aborts).
    if (!watch.explains(e)) throw;
    out_of_memory = true;
    local_loss = at::Tensor();
    local_weight = at::Tensor();
  }
  write_report(
      control, rank,
      RankReport{out_of_memory, out_of_memory ? phase : AttemptPhase::kNone, memory::peak_bytes(),
                 stop_requested(), abandoned, seconds_since(compute_start)},
      control_values.data());
  reduce->write(control_region, control_values.data());
  if (local_loss.defined()) {
    at::Tensor slots = reduce->view(control_region);
    slots.narrow(0, static_cast<std::int64_t>(control.loss()), 1).copy_(local_loss.reshape({1}));
    slots.narrow(0, static_cast<std::int64_t>(control.weight()), 1)
        .copy_(local_weight.reshape({1}));
  }

  // On a GPU, NCCL's stream waits for the backward pass through an event: the time below
  // includes backward kernels still queued.
  const auto reduce_start = Clock::now();
  reduce_comm().allreduce_sum(reduce->all().data_ptr<float>(),
                              static_cast<std::size_t>(reduce->all().numel()));
  allreduce_seconds += seconds_since(reduce_start);
  reduce->read(control_region, control_values.data());

  StepOutcome outcome = agree_on_step(control, control_values.data());
  for (int r = 0; r < world; ++r) {
    auto& peak = peak_bytes[static_cast<std::size_t>(r)];
    peak = std::max(peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
  }
  if (outcome.succeeded()) {
    // The mean over what the global batch counted, and the loss scale undone, in one pass.
    const double divisor = (outcome.weight > 0 ? outcome.weight : 1.0) * loss_scale.value();
    if (divisor != 1.0) reduce->view(gradient_region).mul_(1.0 / divisor);
    model_state->apply_mean_change(reduce->view(buffer_region), world);
    guard->commit();
  }
  return outcome;  // otherwise the guard restores buffers and random state
}

void Trainer::State::after_out_of_memory(const StepOutcome& outcome) {
  OomEvent event;
  event.step = step;
  event.ranks = outcome.out_of_memory;
  event.ranks_text = outcome.ranks_text();
  event.where_text = outcome.phases_text();
  for (int r : event.ranks) {
    event.micro_batches.push_back(micro_batches->current(r));
    event.probe = event.probe || micro_batches->probing(r);
  }
  const bool can_shrink = micro_batches->after_oom(event.ranks);
  if (can_shrink) {
    for (int r : event.ranks)
      event.next.push_back(micro_batches->current(r));
  }
  event.per_rank = micro_batches->per_rank();
  event.world = world;
  event.limit_text = limit_text(options.memory_limits.empty() ? std::vector<int>{} : event.ranks);
  result.oom_events += static_cast<std::int64_t>(event.ranks.size());
  notify([&](StepObserver& o) { o.on_oom(event); });
  if (!can_shrink) {
    std::int64_t worst_peak = 0;
    for (int r : event.ranks)
      worst_peak = std::max(worst_peak, outcome.peak_bytes[static_cast<std::size_t>(r)]);
    std::ostringstream message;
    message << event.ranks_text << " ran out of memory at micro-batch "
            << sizes_text(event.micro_batches) << event.where_text << " (limit " << event.limit_text
            << ", peak " << memory::format_bytes(worst_peak) << ") at step " << step << ": ";
    if (micro_batches->automatic()) {
      message << "the model does not fit even at micro-batch 1; raise --memory-limit, use more "
                 "ranks or a smaller model";
    } else {
      message << "--micro-batch " << event.micro_batches.front()
              << " is fixed; use --micro-batch auto to let autoaccum find a size that fits";
    }
    fail_run(message.str(), ExitCode::kOutOfMemory);
  }
  memory::release_cached_memory();
}

// --balance throughput: every --balance-every steps, new shares in proportion to each rank's
// measured rows per second since the last change, computed by every rank from the same reduced
// numbers. They apply from the step after next: the prefetcher is already reading the next one.
void Trainer::State::rebalance(const std::vector<std::int64_t>& step_shares,
                               const std::vector<double>& compute_seconds) {
  speed_window.add(step_shares, compute_seconds);
  if (step % options.balance_every != 0 || step + 1 >= total_steps) return;
  const std::vector<double> speeds = speed_window.speeds();
  speed_window.clear();
  if (std::any_of(speeds.begin(), speeds.end(), [](double v) { return !(v > 0); })) return;
  std::vector<std::int64_t> floors;
  for (int r = 0; r < world; ++r)
    floors.push_back(std::min(micro_batches->current(r), options.global_batch / world));
  const auto next = balanced_shares(options.global_batch, speeds, floors);
  if (next == shares->shares(step + 1)) return;
  shares->change(step + 1, next);
  std::vector<std::int64_t> rates;
  for (double v : speeds)
    rates.push_back(static_cast<std::int64_t>(std::lround(v)));
  say("step " + std::to_string(step) + ": rows per rank " + sizes_text(next) + " from step " +
      std::to_string(step + 1) + " (measured rows/s " + sizes_text(rates) + ")");
}

void Trainer::State::stop_for_signal(const std::string& where) {
  save_checkpoint();
  finish("preempted");
  say("autoaccum: stopped by a signal at step " + std::to_string(step) + where +
      (options.checkpoint.empty() ? std::string(" (no --checkpoint given: progress is lost)")
                                  : "; checkpoint written to " + options.checkpoint));
  result.preempted = true;
}

void Trainer::State::evaluate() {
  if (!val_reader) return;
  const std::int64_t m = options.eval_micro_batch > 0
                             ? options.eval_micro_batch
                             : std::max<std::int64_t>(micro_batches->current(rank) * 4, 256);
  const EvalEvent event =
      train::evaluate(*model, *objective, *val_reader, comm, m, step, options.precision,
                      [this](const at::Tensor& t) { return context.on_device(t); });
  result.eval_loss = event.loss;
  result.eval_accuracy =
      event.classification ? std::optional<double>(event.accuracy) : std::nullopt;
  notify([&](StepObserver& o) { o.on_eval(event); });
}

Trainer::Trainer(const TrainOptions& options, comm::Communicator& comm)
    : state_(std::make_unique<State>(options, comm)) {
  state_->setup();
}

Trainer::~Trainer() = default;

Model& Trainer::model() {
  return *state_->model;
}

at::Tensor Trainer::last_gradient() const {
  return state_->reduce->view(state_->gradient_region).clone();
}

TrainResult Trainer::run() {
  try {
    return run_steps();
  } catch (const CollectiveError& e) {
    state_->finish("failed", e.what());  // every rank threw it; only rank 0 has the log
    throw;
  }
}

TrainResult Trainer::run_steps() {
  State& s = *state_;
  const auto& o = s.options;
  const std::int64_t per_epoch = s.plan->batches_per_epoch();
  data::Prefetcher prefetcher(
      [&s](std::int64_t global_step) { return s.read_rank_rows(global_step); }, s.step,
      s.total_steps);
  double last_loss = 0;

  while (s.step < s.total_steps) {
    // Read the slab.
    const auto step_start = Clock::now();
    const double waited_before = prefetcher.waited_seconds();
    const data::Batch slab = prefetcher.next();
    const double data_wait = prefetcher.waited_seconds() - waited_before;

    // Attempt, reduce, agree; retry smaller after an agreed out-of-memory.
    std::int64_t retries = 0;
    double retry_seconds = 0;
    s.allreduce_seconds = 0;
    StepOutcome outcome;
    for (;;) {
      const auto attempt_start = Clock::now();
      outcome = s.attempt(slab, s.micro_batches->current(s.rank));
      if (outcome.succeeded() || outcome.abandoned) break;
      retry_seconds += seconds_since(attempt_start);
      ++retries;
      s.after_out_of_memory(outcome);
    }

    if (outcome.abandoned) {
      // A stop signal came between micro-batches: this step is not taken (its partial gradient
      // is dropped; buffers and random state were restored), the checkpoint holds the state
      // before it, and a resumed run computes it whole.
      s.stop_for_signal(" (in step " + std::to_string(s.step + 1) +
                        ", between micro-batches: that step is dropped and computed again on "
                        "resume)");
      break;
    }

    // Step.
    const double lr = s.schedule.lr(s.step);
    const double loss_scale = s.loss_scale.value();
    auto stepped = s.optimizer->apply(s.reduce->view(s.gradient_region), outcome.loss, lr);
    // fp16: gradients that overflowed at this scale (the loss itself finite) are the scale's
    // doing. Every rank saw the same reduced gradients: all skip and halve together.
    const bool overflow = stepped != OptimizerStep::Result::kStepped &&
                          std::isfinite(outcome.loss) && s.loss_scale.explains_overflow();
    if (overflow) {
      stepped = OptimizerStep::Result::kSkipped;
      s.loss_scale.after_overflow();
      ++s.result.overflow_steps;
      std::ostringstream line;
      line << "step " << s.step << ": fp16 gradients overflowed at loss scale " << loss_scale
           << "; every rank skips the step and continues at " << s.loss_scale.value();
      s.say(line.str());
    } else if (stepped == OptimizerStep::Result::kStepped) {
      s.loss_scale.after_clean_step();
    }
    if (stepped == OptimizerStep::Result::kStop) {
      s.fail_run("non-finite loss or gradient at step " + std::to_string(s.step) + " (loss " +
                     std::to_string(outcome.loss) +
                     "); lower --lr, set --clip-grad-norm, or --on-nonfinite skip",
                 ExitCode::kInternal);
    }
    const bool skipped = stepped == OptimizerStep::Result::kSkipped;
    if (skipped && !overflow) {
      ++s.result.skipped_steps;
      s.say("step " + std::to_string(s.step) +
            ": non-finite loss or gradient on some rank; step skipped (" +
            std::to_string(s.result.skipped_steps) + " so far)");
    }
    const std::vector<std::int64_t> step_shares = s.shares->shares(s.step);
    ++s.step;
    last_loss = outcome.loss;

    // Notify observers.
    const double step_seconds = seconds_since(step_start);
    io::StepRow row;
    row.step = s.step - 1;
    row.epoch = (s.step - 1) / per_epoch;
    row.micro_batch = s.micro_batches->current(0);
    row.accumulation = s.micro_batches->accumulation(0, step_shares.front());
    row.loss = outcome.loss;
    row.lr = lr;
    row.loss_scale = loss_scale;
    row.step_seconds = step_seconds;
    row.samples_per_second = static_cast<double>(o.global_batch) / step_seconds;
    row.oom_retries = retries;
    row.skipped = skipped ? 1 : 0;
    row.data_wait_seconds = data_wait;
    row.peak_bytes = *std::max_element(s.peak_bytes.begin(), s.peak_bytes.end());
    row.live_bytes = memory::live_bytes();
    row.allreduce_seconds = s.allreduce_seconds;
    row.retry_seconds = retry_seconds;
    RankFigures figures;
    figures.peak_bytes = s.peak_bytes;
    figures.micro_batches = s.micro_batches->sizes();
    figures.rows = step_shares;
    s.notify([&](StepObserver& observer) { observer.on_step(row, figures); });
    if (o.balance) s.rebalance(step_shares, outcome.compute_seconds);

    // Evaluation, checkpoints, signals, and the next size to probe.
    if (o.eval_every > 0 && s.step % o.eval_every == 0 && s.step < s.total_steps) s.evaluate();
    if (o.checkpoint_every > 0 && s.step % o.checkpoint_every == 0 && s.step < s.total_steps)
      s.save_checkpoint();
    if (outcome.stop && s.step < s.total_steps) {
      s.stop_for_signal("");
      break;
    }
    const std::vector<int> probing =
        s.step < s.total_steps ? s.micro_batches->after_success() : std::vector<int>{};
    if (!probing.empty() && !s.micro_batches->per_rank())
      s.say("probing micro-batch " + std::to_string(s.micro_batches->current(0)) + " at step " +
            std::to_string(s.step));
    for (int r : s.micro_batches->per_rank() ? probing : std::vector<int>{})
      s.say("rank " + std::to_string(r) + " probes micro-batch " +
            std::to_string(s.micro_batches->current(r)) + " at step " + std::to_string(s.step));
  }

  if (!s.result.preempted) {
    s.save_checkpoint();  // first: an evaluation that fails must not cost the trained model
    s.evaluate();
    s.finish("completed");
  }
  s.result.steps_done = s.step;
  s.result.final_micro_batch = s.micro_batches->current(s.rank);
  s.result.final_micro_batches = s.micro_batches->sizes();
  s.result.final_loss = last_loss;
  return s.result;
}

}  // namespace autoaccum::train
