// Trainer setup: threads and device, outputs, data, model, the setup trial, the step's
// buffers and optimizer state, observers and the banner; every step that can fail is agreed
// on by all ranks (docs/design.md, "Inside train").
#include "autoaccum/train/trainer.hpp"

#include <sched.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/factory.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/comm/watchdog.hpp"
#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/console.hpp"
#include "autoaccum/core/distinct_paths.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/core/output_lock.hpp"
#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/model/model_bundle.hpp"
#include "autoaccum/train/reduce/reduce_buffer.hpp"
#include "autoaccum/train/run/observers.hpp"
#include "autoaccum/train/sizing/balance.hpp"
#include "autoaccum/train/sizing/micro_batch.hpp"
#include "autoaccum/train/step/optimizer_step.hpp"
#include "autoaccum/train/step/schedule.hpp"
#include "autoaccum/train/step/step_agreement.hpp"

#include "run_state.hpp"

namespace autoaccum::train {
namespace {

// The default thread count: the CPUs this rank may run on (its affinity mask: Slurm's
// --cpus-per-task, mpirun's binding, taskset), or, when the rank is not bound, the node's cores
// shared among its ranks.
struct ThreadChoice {
  int count = 1;
  std::string source;
};

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

// Runs `make`; an out-of-memory in it becomes one line saying that `what` does not fit under
// `limit`, exit code 3 (under collectively(), every rank ends so).
template <class Make>
void within_memory(const std::string& what, const std::string& limit, Make&& make) {
  memory::OomWatch watch;
  try {
    make();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    if (!watch.explains(e)) throw;
    throw Error(what + " do not fit in memory (limit " + limit +
                    "); raise --memory-limit or use a smaller model",
                ExitCode::kOutOfMemory);
  }
}

}  // namespace

Trainer::State::WatchdogRelease::~WatchdogRelease() {
  comm::watchdog().set_last_words(nullptr);
  comm::watchdog().set_context("");
}

std::string Trainer::State::watchdog_context() const {
  std::string text =
      step < feed.total_steps()
          ? "in step " + std::to_string(step + 1) + " of " + std::to_string(feed.total_steps())
          : "after the last step (" + std::to_string(step) + ")";
  if (options.checkpoint.empty())
    text += "; no --checkpoint was given";
  else if (checkpoint_step < 0)
    text += "; no checkpoint written yet (" + options.checkpoint + ")";
  else
    text +=
        "; last checkpoint: " + options.checkpoint + " at step " + std::to_string(checkpoint_step);
  return text;
}

void Trainer::State::setup() {
  rank = comm.rank();
  world = comm.size();
  root = rank == 0;
  loss_scale = LossScale(options.precision == Precision::kFp16);
  options.memory_limit = sizing.limits().given(rank);  // --memory-limit A,B,...: this rank's item
  const ThreadChoice threads = choose_threads(options.threads, comm.local_size());
  thread_source = threads.source;
  at::set_num_threads(threads.count);
  memory::tune_malloc();
  // From here on every collective has a deadline (comm/watchdog.hpp). The thread's last words
  // run while this rank's main thread is blocked inside MPI: rank 0 writes the run log's status.
  comm::Watchdog& dog = comm::watchdog();
  dog.configure(std::chrono::milliseconds(std::llround(options.collective_timeout_seconds * 1000)),
                rank);
  dog.set_context("during setup");
  dog.set_last_words([this](const std::string& message) { finish("failed", message); });

  choose_device();
  // Each rank's limit, known on every rank: its --memory-limit item on the CPU; on a GPU the
  // limit given, or else the device's memory.
  std::int64_t limit = options.memory_limit;
  if (context.use_cuda && limit <= 0) limit = memory::cuda_total_bytes(context.device.index());
  sizing.gather_limits(limit);
  // The shards' globs expanded once: the outputs are checked against them, then they are read.
  comm::collectively(comm, [&] { feed.expand_paths(); });
  take_outputs();  // before anything is written, so a second job on them is refused at once
  open_data();
  comm::collectively(comm, [&] {
    schedule =
        make_schedule(options.lr, options.warmup_steps, feed.total_steps(), options.schedule);
    if (options.lr <= 0 || !std::isfinite(options.lr)) throw UsageError("--lr must be positive");
  });
  start_loss_scale();
  build_model();
  trial();
  allocate_step_state();
  seed_generators_for_rank(options.seed, rank);
  resume();
  open_observers();
  announce();
}

void Trainer::State::start_loss_scale() {
  if (!loss_scale.enabled()) return;
  // What one rank's share of a step counts in the summed loss: its tokens for documents, its
  // rows times the target's elements per row otherwise (a token per position for a language
  // model's rows, one for a class label). Every rank computes the same from the options.
  const data::DataSchema& schema = feed.reader().schema();
  double count = 0;
  if (schema.documents) {
    const double mean_length = static_cast<double>(schema.tokens) /
                               static_cast<double>(std::max<std::size_t>(schema.lengths.size(), 1));
    count = (options.global_batch_tokens > 0
                 ? static_cast<double>(options.global_batch_tokens)
                 : static_cast<double>(options.global_batch) * mean_length) /
            world;
  } else {
    double per_row = 1;
    for (const std::int64_t extent : schema.target().row_shape)
      per_row *= static_cast<double>(std::max<std::int64_t>(extent, 1));
    count = static_cast<double>(options.global_batch) / world * per_row;
  }
  loss_scale = LossScale(true, LossScale::initial_for(count));
}

void Trainer::State::choose_device() {
  const auto& o = options;
  // "auto" is CUDA only when every rank sees a GPU. The GPU is chosen by the node-local rank
  // among the visible ones (the NCCL communicator picks the same one); --memory-limit then
  // caps the CUDA caching allocator.
  const memory::CudaDevices visible = memory::cuda_devices();
  const int gpus = visible.count;
  const bool gpus_everywhere = comm.allreduce_min(gpus > 0 ? 1 : 0) == 1;
  comm::collectively(comm, [&] {
    // A driver that cannot be asked is an error on the node, not a node without GPUs: said, not
    // turned into a run on the CPU.
    if (!visible.problem.empty() && o.device != "cpu") {
      throw UsageError("--device " + o.device + ": rank " + std::to_string(rank) +
                       " cannot ask the CUDA driver for its GPUs (" + visible.problem +
                       "); fix the driver or use --device cpu");
    }
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

// The data (sizing/data_feed.hpp) and every rank's micro-batch policy within the bounds the data
// sets: collective, every rank agreeing on any error.
void Trainer::State::open_data() {
  comm::collectively(comm, [&] {
    feed.open(root);
    sizing.start({});
  });
}

void Trainer::State::take_outputs() {
  // Rank 0 writes both; a live job holding either refuses this one, and a dead one's lock is
  // taken over with a warning.
  comm::collectively(comm, [&] {
    if (!root) return;
    // No output may be an input or the other output (a link to it counts).
    std::vector<core::NamedPath> inputs;
    for (const auto& path : feed.paths())
      inputs.push_back({"--data", path});
    for (const auto& path : feed.validation_paths())
      inputs.push_back({"--val-data", path});
    inputs.push_back({"--model-file", options.model_file});
    core::check_outputs_apart(
        inputs, {{"--run-log", options.run_log}, {"--checkpoint", options.checkpoint}});
    if (!options.run_log.empty()) check_writable_file("--run-log", options.run_log);
    if (!options.checkpoint.empty()) check_writable_file("--checkpoint", options.checkpoint);
    if (!options.run_log.empty())
      locks.push_back(std::make_unique<OutputLock>("--run-log", options.run_log));
    if (!options.checkpoint.empty())
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

// The model (its objective chosen from the training data's targets), equal on every rank and on
// its device, in a bundle with its parameters and attempt state (model/model_bundle.hpp).
void Trainer::State::build_model() {
  const auto& o = options;
  std::unique_ptr<Model> built;
  std::optional<Objective> objective;
  comm::collectively(comm, [&] {
    const auto& schema = feed.reader().schema();
    const bool classification = schema.target().type == data::FieldType::kInt64;
    objective.emplace(Objective::choose(o.loss, schema.target(),
                                        classification ? *schema.num_classes : 0, o.ignore_index));
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
    within_memory("the model's parameters", sizing.limits().text({rank}),
                  [&] { built = make_model(spec); });
  });
  // Rank 0's initial parameters and buffers everywhere (equal by seeding or by the file; this
  // makes it certain). Broadcast on the host, before the model moves to its device.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : built->parameters())
      comm.broadcast(p.data_ptr(), static_cast<std::size_t>(p.nbytes()), 0);
  }
  if (context.use_cuda) {
    comm::collectively(comm, [&] {
      within_memory("the model's parameters", sizing.limits().text({rank}),
                    [&] { built->to(context.device); });
      feed.reader().set_pinned(true);
      if (feed.validation()) feed.validation()->set_pinned(true);
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
  bundle = std::make_unique<ModelBundle>(std::move(built), std::move(*objective));
  if (const std::string warning = bundle->model().mode_warning();
      !warning.empty() && root && !options.quiet)
    core::write_line(stderr, "autoaccum: warning: " + warning);
  // Every rank loaded the same file, so every rank reaches this verdict without a word.
  if (const std::string why = bundle->nothing_to_train(); !why.empty())
    throw CollectiveError(model_name() + ": nothing to train: " + why, ExitCode::kUsage, 0);
  comm::collectively(comm, [&] { bundle->hold_state(context.device, world, rank); });
}

// One forward and loss on this rank's first rows, in eval mode and without gradients, so that
// a model that cannot take the data fails here with one line, not at step 0 with a traceback
// per rank. Buffers and random state are restored: the trial leaves no trace.
void Trainer::State::trial() {
  comm::collectively(comm, [&] {
    const data::RowRange part = feed.plan().rank_rows(/*epoch=*/0, /*step=*/0, rank);
    if (part.size() < 1) return;
    const data::Batch rows = [&] {
      const memory::UncountedScope staging;
      data::Batch slab = feed.reader().read(part.begin, std::min(part.end, part.begin + 2));
      if (!slab.documents()) return slab;
      // Documents: the first two, padded as one micro-batch.
      const auto cut = data::plan_micro_batches(slab, std::numeric_limits<std::int64_t>::max() / 4);
      return data::micro_batch(slab, cut.pieces.front());
    }();
    run_trial(rows);
  });
}

// The trial's forward and loss; an error names the model, the data and its shapes.
void Trainer::State::run_trial(const data::Batch& rows) {
  const auto& schema = feed.reader().schema();
  std::ostringstream what;
  what << model_name() << " on --data '" << feed.reader().paths().front() << "' (";
  for (std::size_t i = 0; i + 1 < rows.size(); ++i) {
    const at::Tensor& t = rows[i];
    std::vector<std::int64_t> shape(t.sizes().begin(), t.sizes().end());
    what << (i ? ", " : "") << schema.fields[i].name << " " << shape_text(shape) << " "
         << t.scalar_type();
  }
  what << "): ";
  Model& model = bundle->model();
  const Objective& objective = bundle->objective();
  AttemptGuard guard(bundle->state());  // never committed
  torch::NoGradGuard no_grad;
  model.set_training(false);  // one row must do: BatchNorm1d cannot take it in train mode
  struct TrainAgain {
    Model& model;
    ~TrainAgain() { model.set_training(true); }
  } train_again{model};
  memory::OomWatch watch;
  try {
    std::vector<at::Tensor> inputs;
    for (std::size_t i = 0; i + 1 < rows.size(); ++i)
      inputs.push_back(context.on_device(rows[i]));
    const at::Tensor target = context.on_device(rows[rows.size() - 1]);
    const AutocastScope autocast(options.precision, context.device.type());
    if (objective.from_model()) {
      (void)model.forward_loss(inputs, target).first.item<double>();
    } else {
      const at::Tensor output = model.forward(inputs);
      const std::string problem = objective.check_output(output, rows.rows(), options.targets);
      if (!problem.empty()) throw InputError(problem);
      (void)objective.terms(output, target).sum.item<double>();
    }
  } catch (const InputError& e) {
    throw InputError(what.str() + e.what());
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    if (watch.explains(e)) {
      throw Error("the model does not fit in memory (limit " + sizing.limits().text({rank}) +
                      ") even for the setup trial's " + std::to_string(rows.rows()) + " rows",
                  ExitCode::kOutOfMemory);
    }
    const std::string hint = objective.from_model()
                                 ? "--loss model calls forward(inputs..., targets) and needs "
                                   "(loss_sum, weight) back: "
                                 : "";
    throw InputError(what.str() + hint + torch_error_summary(e));
  }
}

// The gradient exchange (its buffer and the gradient views) and the optimizer state, allocated
// once: a model that cannot hold them fails here, with exit code 3, not inside a step.
void Trainer::State::allocate_step_state() {
  comm::collectively(comm, [&] {
    const std::string what =
        "the model's parameters, gradients and optimizer state (with room for the optimizer "
        "step's temporaries)";
    within_memory(what, sizing.limits().text({rank}), [&] {
      GradientExchange::Sizes sizes;
      sizes.buffer_floats = bundle->state().reduce_count();
      sizes.control_floats = StepRunner::control_floats(world);
      sizes.frozen_elements = bundle->parameters().frozen_elements;
      exchange = std::make_unique<GradientExchange>(options, comm, reduce_comm(), context.device,
                                                    bundle->parameters().trainable, sizes);
      // Sharded: this rank's slice, one flat tensor, its norm's square summed over the ranks.
      optimizer = sharded()
                      ? std::make_unique<OptimizerStep>(
                            options, exchange->reducer().stepped(),
                            [this](double mine) { return exchange->reducer().total(mine); })
                      : std::make_unique<OptimizerStep>(options, bundle->parameters().trainable);
      // Room for the update's temporaries (OptimizerStep::temporary_bytes): a model that leaves
      // none fails here, not in its first optimizer step.
      (void)at::empty({optimizer->temporary_bytes()},
                      at::TensorOptions(context.device).dtype(at::kByte));
    });
  });
  if (options.shard != "none" && world == 1)
    reporter.note("--shard " + options.shard +
                  " on one rank: nothing to shard; the optimizer state and the gradients "
                  "stay whole on this rank");
  exchange->choose_overlap(context.use_cuda);
  optimizer_checkpoint = std::make_unique<OptimizerCheckpoint>(
      comm, *optimizer, exchange->reducer(), bundle->parameters().trainable,
      trainable_names(bundle->model().named_parameters(), bundle->parameters().trainable));
  runner = std::make_unique<StepRunner>(StepRunner::Rooms{options, comm, context, *bundle,
                                                          *optimizer, schedule, loss_scale,
                                                          *exchange, sizing, feed, reporter});
  if (context.gradient_comm) {
    // NCCL allocates its device buffers at the first collective. One all-reduce of the whole
    // (zero) buffer now takes them before the search fills the cache, and a GPU too full even
    // for them stops here with an out-of-memory message, before the first step.
    comm::collectively(comm, [&] { exchange->reducer().warm_up(); });
  }
}

void Trainer::State::probe_precision() {
  if (!root) return;
  // Only a report: a device without lower-precision products (an older GPU) fails the probe,
  // which must not stop an fp32 run; a bf16 run there fails at its first step instead.
  try {
    lower_gemm_speedup =
        gemm_speedup(autocast_dtype_for(options.precision == Precision::kFp32 ? Precision::kBf16
                                                                              : options.precision,
                                        context.device.type()),
                     context.device);
  } catch (const std::exception& e) {
    lower_gemm_speedup = 0;
    gemm_probe_failure = torch_error_summary(e);
  }
}

}  // namespace autoaccum::train
