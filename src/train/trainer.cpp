// Trainer: one collective per attempt carries the gradients, the OOM flags and the step's
// control values; every rank takes the same decision from the same reduced numbers.
#include "autoaccum/train/trainer.hpp"

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/comm/factory.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/prefetcher.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "autoaccum/io/run_log.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/train/flat_gradients.hpp"
#include "autoaccum/train/micro_batch.hpp"
#include "autoaccum/train/schedule.hpp"

namespace autoaccum::train {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string hostname() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

std::string duration_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  char text[32];
  std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

std::string rate_text(double per_second) {
  char text[32];
  if (per_second >= 1000)
    std::snprintf(text, sizeof text, "%.1fk", per_second / 1000);
  else
    std::snprintf(text, sizeof text, "%.0f", per_second);
  return text;
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

// Slots after the gradients in the one all-reduced buffer (see docs/design.md).
struct Slots {
  std::size_t world;
  std::size_t oom(int rank) const { return static_cast<std::size_t>(rank); }  // 1: it hit OOM
  std::size_t peak_kib(int rank) const { return world + oom(rank); }          // its peak, KiB
  std::size_t loss() const { return 2 * world; }      // sum of scaled losses
  std::size_t stop() const { return 2 * world + 1; }  // signals received
  std::int64_t count() const { return static_cast<std::int64_t>(2 * world + 2); }
};

struct Trainer::State {
  TrainOptions options;
  comm::Communicator& comm;
  // --device cuda: the model, micro-batches and flat gradients live on this rank's GPU and the
  // gradients go through gradient_comm (NCCL); the control plane stays on `comm`.
  bool use_cuda = false;
  c10::Device device{c10::kCPU};
  std::unique_ptr<comm::Communicator> gradient_comm;
  comm::Communicator& data_comm() { return gradient_comm ? *gradient_comm : comm; }
  at::Tensor on_device(const at::Tensor& t) const {
    return use_cuda ? t.to(device, /*non_blocking=*/true) : t;  // CPU: the view itself
  }
  int rank = 0;
  int world = 1;
  bool root = false;
  Slots slots{1};

  std::unique_ptr<data::SlabReader> reader;
  std::unique_ptr<data::SlabReader> val_reader;
  std::unique_ptr<data::BatchPlan> plan;
  bool classification = true;
  std::int64_t target_elements = 1;  // per row, for regression
  std::int64_t total_steps = 0;

  std::unique_ptr<Model> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<FlatGradients> gradients;
  std::unique_ptr<MicroBatchPolicy> policy;
  Schedule schedule;
  std::int64_t step = 0;  // optimizer steps completed
  bool checked_views = false;
  std::vector<float> slot;       // host copy of the slots of the last attempt
  double allreduce_seconds = 0;  // this step's time in the gradient all-reduce (rank's own)

  std::optional<io::RunLogWriter> run_log;
  std::vector<std::string> hostnames;
  std::vector<std::int64_t> peak_bytes;  // per rank, largest seen
  Clock::time_point last_flush = Clock::now();
  std::int64_t steps_since_flush = 0;
  TrainResult result;

  State(const TrainOptions& o, comm::Communicator& c) : options(o), comm(c) {}

  void setup();
  void restore(const io::Checkpoint& checkpoint);
  io::Checkpoint snapshot();
  void save_checkpoint();
  at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, std::int64_t global_rows);
  bool attempt(const data::Batch& slab, std::int64_t m, double& loss);
  void evaluate();
  // Flushes (or finishes) the run log. A failure here must not stop training: it is reported
  // and the rows stay buffered for the next flush.
  void write_log(const std::string& status = "", const std::string& message = "") {
    if (!run_log) return;
    run_log->set_peak_bytes(peak_bytes);
    run_log->set_final_micro_batch(policy->current());
    try {
      if (status.empty())
        run_log->flush();
      else
        run_log->finish(status, message);
    } catch (const std::exception& e) {
      std::cerr << "autoaccum: warning: run log not updated (" << e.what() << "); will retry"
                << std::endl;
    }
  }
  void say(const std::string& line) const {
    if (root && !options.quiet) std::cout << line << std::endl;
  }
};

void Trainer::State::setup() {
  rank = comm.rank();
  world = comm.size();
  root = rank == 0;
  slots = Slots{static_cast<std::size_t>(world)};
  const auto& o = options;

  int threads = o.threads;
  if (threads <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, cores / std::max(1, comm.local_size()));
  }
  at::set_num_threads(threads);
  memory::tune_malloc();

  // The device: "auto" is CUDA only when every rank sees a GPU. The GPU is chosen by the
  // node-local rank among the visible ones (the NCCL communicator picks the same one);
  // --memory-limit then caps the CUDA caching allocator.
  const int gpus = memory::cuda_built() ? comm::cuda_device_count() : 0;
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
  use_cuda = o.device == "cuda" || (o.device == "auto" && gpus_everywhere);
  // On CUDA, host tensors are still counted, never limited; the limit is the GPU's.
  memory::install_cpu_budget(use_cuda ? 0 : o.memory_limit);
  if (use_cuda) {
    const int index = comm.local_rank() % gpus;
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    comm::collectively(comm, [&] { memory::use_cuda_device(index, o.memory_limit); });
  }

  // Open and check the data on every rank; every rank learns of any rank's problem.
  comm::collectively(comm, [&] {
    reader =
        std::make_unique<data::SlabReader>(data::expand_data_paths(o.data), o.inputs, o.targets);
    if (!o.val_data.empty()) {
      val_reader = std::make_unique<data::SlabReader>(data::expand_data_paths(o.val_data), o.inputs,
                                                      o.targets);
      const auto& a = reader->schema();
      const auto& b = val_reader->schema();
      for (std::size_t i = 0; i < a.fields.size(); ++i) {
        if (a.fields[i].type != b.fields[i].type ||
            a.fields[i].row_shape != b.fields[i].row_shape) {
          throw InputError("--val-data: dataset '" + b.fields[i].name +
                           "' differs in type or shape from the training data");
        }
      }
    }
    plan = std::make_unique<data::BatchPlan>(reader->schema().rows, o.global_batch, world,
                                             data::parse_shuffle(o.shuffle), o.seed);
    if (o.steps < 0 || o.epochs < 0) throw UsageError("--steps and --epochs must not be negative");
    total_steps =
        o.steps > 0
            ? o.steps
            : static_cast<std::int64_t>(o.epochs * static_cast<double>(plan->batches_per_epoch()));
    if (total_steps < 1)
      throw UsageError("nothing to do: give --steps N or --epochs E (E * batches per epoch >= 1)");
    policy = std::make_unique<MicroBatchPolicy>(plan->max_rank_rows(), o.micro_batch, std::nullopt,
                                                o.refine_micro_batch);
    schedule = make_schedule(o.lr, o.warmup_steps, total_steps, o.schedule);
    if (o.lr <= 0 || !std::isfinite(o.lr)) throw UsageError("--lr must be positive");

    const auto& schema = reader->schema();
    classification = schema.target().type == data::FieldType::kInt64;
    target_elements = 1;
    for (auto d : schema.target().row_shape)
      target_elements *= d;
    ModelSpec spec;
    spec.kind = o.model;
    spec.hidden = o.hidden;
    spec.file = o.model_file;
    spec.input_shape = schema.fields.front().row_shape;
    spec.outputs = classification ? *schema.num_classes : target_elements;
    torch::manual_seed(o.seed);
    model = make_model(spec);
  });

  // Rank 0's initial parameters everywhere (they are equal by seeding; this makes it certain).
  // Broadcast on the host, before the model moves to its device.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      comm.broadcast(p.data_ptr(), static_cast<std::size_t>(p.nbytes()), 0);
  }
  if (use_cuda) {
    comm::collectively(comm, [&] {
      model->to(device);
      reader->set_pinned(true);
      if (val_reader) val_reader->set_pinned(true);
    });
    // The gradient communicator for device buffers (--backend auto: NCCL), bootstrapped over
    // MPI; every rank builds it, or every rank learns why not.
    comm::collectively(comm, [&] {
      gradient_comm =
          comm::make_communicator(comm::parse_backend(options.backend), comm::MemoryKind::kDevice);
    });
  }
  gradients = std::make_unique<FlatGradients>(model->parameters(), slots.count());
  slot.assign(static_cast<std::size_t>(slots.count()), 0.0f);
  comm::collectively(comm, [&] {
    if (options.optimizer == "sgd") {
      optimizer = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                      torch::optim::SGDOptions(options.lr)
                                                          .momentum(options.momentum)
                                                          .weight_decay(options.weight_decay));
    } else if (options.optimizer == "adamw") {
      optimizer = std::make_unique<torch::optim::AdamW>(
          model->parameters(),
          torch::optim::AdamWOptions(options.lr).weight_decay(options.weight_decay));
    } else {
      throw UsageError("--optimizer: '" + options.optimizer + "' is not one of sgd, adamw");
    }
  });

  // Resume when asked and a checkpoint is there (a requeued job finds its own).
  if (options.resume) {
    if (options.checkpoint.empty())
      throw CollectiveError("--resume needs --checkpoint FILE", ExitCode::kUsage, 0);
    std::optional<io::LoadedCheckpoint> loaded;
    comm::collectively(comm, [&] { loaded = io::read_latest_checkpoint(options.checkpoint); });
    if (comm.allreduce_min(loaded ? 1 : 0) == 1) {
      if (!loaded->warning.empty()) say("autoaccum: warning: " + loaded->warning);
      restore(loaded->checkpoint);
    } else {
      say("no checkpoint at " + options.checkpoint + " yet: starting from step 0");
    }
  }

  // Host names for the run log, gathered once.
  std::vector<char> names(static_cast<std::size_t>(world) * 64, '\0');
  std::string mine = hostname().substr(0, 63);
  std::vector<char> own(64, '\0');
  std::copy(mine.begin(), mine.end(), own.begin());
  comm.allgather(own.data(), 64, names.data());
  for (int r = 0; r < world; ++r)
    hostnames.emplace_back(names.data() + r * 64);
  peak_bytes.assign(static_cast<std::size_t>(world), 0);

  comm::collectively(comm, [&] {
    if (!root) return;  // rank 0 writes both
    if (!options.run_log.empty()) check_writable_file("--run-log", options.run_log);
    if (!options.checkpoint.empty()) check_writable_file("--checkpoint", options.checkpoint);
  });
  if (!options.run_log.empty()) {
    comm::collectively(comm, [&] {
      if (!root) return;
      if (options.resume && step > 0 && access(options.run_log.c_str(), F_OK) == 0) {
        run_log = io::RunLogWriter::append(options.run_log);
      } else {
        io::RunLogHeader header;
        header.world_size = world;
        header.global_batch = options.global_batch;
        header.micro_batch_mode = policy->automatic() ? "auto" : "fixed";
        header.command_line = options.command_line;
        header.started_at = io::utc_now();
        header.hostnames = hostnames;
        header.text = {
            {"model", model->describe()},
            {"optimizer", options.optimizer},
            {"schedule", options.schedule},
            {"data", reader->paths().front() +
                         (reader->paths().size() > 1
                              ? " (+" + std::to_string(reader->paths().size() - 1) + " shards)"
                              : "")},
            {"memory_limit", options.memory_limit > 0 ? memory::format_bytes(options.memory_limit)
                                                      : std::string("none")}};
        header.numbers = {{"lr", options.lr},
                          {"memory_limit_bytes", static_cast<double>(options.memory_limit)},
                          {"total_steps", static_cast<double>(total_steps)},
                          {"parameters", static_cast<double>(model->parameter_count())},
                          {"threads_per_rank", static_cast<double>(at::get_num_threads())}};
        run_log = io::RunLogWriter::create(options.run_log, header);
      }
    });
  }

  std::ostringstream banner;
  banner << "autoaccum: " << world << " rank(s) on " <<
      [&] {
        std::vector<std::string> unique(hostnames);
        std::sort(unique.begin(), unique.end());
        return std::unique(unique.begin(), unique.end()) - unique.begin();
      }() << " node(s), "
         << at::get_num_threads() << " thread(s) per rank; " << model->describe() << " ("
         << model->parameter_count() << " parameters)\n"
         << "autoaccum: " << reader->schema().rows << " rows, global batch " << options.global_batch
         << " (" << plan->batches_per_epoch() << " batches per epoch), " << total_steps
         << " steps; micro-batch " << (policy->automatic() ? "auto, starting at " : "fixed at ")
         << policy->current() << "; memory limit "
         << (options.memory_limit > 0 ? memory::format_bytes(options.memory_limit) + " per rank"
                                      : "none");
  if (step > 0)
    banner << "\nautoaccum: resumed at step " << step << " with micro-batch " << policy->current();
  say(banner.str());
}

void Trainer::State::restore(const io::Checkpoint& c) {
  std::string problem;
  if (c.world_size != world) {
    // Parameters are still valid; the micro-batch was learned for another per-rank batch.
    say("note: the checkpoint was written by " + std::to_string(c.world_size) + " rank(s); now " +
        std::to_string(world) + ": the micro-batch search starts again");
  }
  auto params = model->named_parameters();
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : params) {
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
    try {
      std::istringstream in(c.optimizer);
      torch::serialize::InputArchive archive;
      archive.load_from(in, device);
      optimizer->load(archive);
    } catch (const c10::Error& e) {
      problem = "'" + options.checkpoint + "': optimizer state does not match: " + e.msg();
    }
  }
  if (auto failure = comm::agree_on_failure(comm, problem)) comm::throw_collective(comm, *failure);
  step = c.step;
  if (c.world_size == world) {
    policy = std::make_unique<MicroBatchPolicy>(plan->max_rank_rows(), options.micro_batch,
                                                c.micro_batch, options.refine_micro_batch);
  }
}

io::Checkpoint Trainer::State::snapshot() {
  io::Checkpoint c;
  c.step = step;
  c.epoch = step / plan->batches_per_epoch();
  c.micro_batch = policy->current();
  c.world_size = world;
  c.seed = options.seed;
  // Host copies (a no-op on the CPU): the checkpoint writer reads host memory.
  c.params = model->named_parameters();
  c.buffers = model->named_buffers();
  for (auto* list : {&c.params, &c.buffers}) {
    for (auto& named : *list)
      named.second = named.second.detach().to(at::kCPU);
  }
  std::ostringstream out;
  torch::serialize::OutputArchive archive;
  optimizer->save(archive);
  archive.save_to(out);
  c.optimizer = out.str();
  return c;
}

void Trainer::State::save_checkpoint() {
  if (options.checkpoint.empty()) return;
  // Parameters are identical on every rank, so rank 0 writes; the others learn how it went.
  comm::collectively(comm, [&] {
    if (root) io::write_checkpoint(options.checkpoint, snapshot());
  });
}

at::Tensor Trainer::State::loss_of(const at::Tensor& output, const at::Tensor& target,
                                   std::int64_t global_rows) {
  // Summed over the rows of the micro-batch and divided by the global batch: the accumulated
  // gradient is then exactly the gradient of the mean loss over the global batch.
  if (classification) {
    return torch::nn::functional::cross_entropy(
               output, target,
               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
           static_cast<double>(global_rows);
  }
  return torch::nn::functional::mse_loss(
             output.reshape(target.sizes()), target,
             torch::nn::functional::MSELossFuncOptions().reduction(torch::kSum)) /
         static_cast<double>(global_rows * target_elements);
}

// One attempt at the current batch with micro-batch m. Returns false when any rank ran out of
// memory (every rank returns the same answer: it comes from the reduced buffer).
bool Trainer::State::attempt(const data::Batch& slab, std::int64_t m, double& loss) {
  gradients->zero();
  std::fill(slot.begin(), slot.end(), 0.0f);
  const std::int64_t global_rows = options.global_batch;
  const auto input_count = static_cast<std::size_t>(slab.size() - 1);
  // The summed loss stays a tensor until after the all-reduce: no host synchronisation per
  // micro-batch (it matters on a GPU).
  at::Tensor local_loss;
  memory::reset_peak();
  try {
    for (std::int64_t offset = 0; offset < slab.rows(); offset += m) {
      const data::Batch micro = slab.slice(offset, m);
      std::vector<at::Tensor> inputs;
      for (std::size_t i = 0; i < input_count; ++i)
        inputs.push_back(on_device(micro[i]));
      at::Tensor output = model->forward(inputs);
      // Injected after the forward pass, so the activations exist when it throws, as in a real
      // OOM late in forward; they must be released like a real one's.
      if (std::any_of(options.inject_oom.begin(), options.inject_oom.end(),
                      [&](const auto& i) { return i.fires(rank, micro.rows(), step); })) {
        memory::throw_out_of_memory("injected out-of-memory (--inject-oom) at micro-batch " +
                                    std::to_string(micro.rows()));
      }
      at::Tensor micro_loss = loss_of(output, on_device(micro[input_count]), global_rows);
      micro_loss.backward();
      local_loss = local_loss.defined() ? local_loss + micro_loss.detach() : micro_loss.detach();
      if (!checked_views) {
        if (!gradients->intact()) throw Error("internal: autograd replaced a gradient view");
        checked_views = true;
      }
    }
  } catch (const std::exception& e) {
    // Only an OOM is agreed on here; anything else is this rank's own failure (spmd_main aborts).
    if (!memory::is_out_of_memory(e)) throw;
    slot[slots.oom(rank)] = 1.0f;
    local_loss = at::Tensor();
  }
  slot[slots.peak_kib(rank)] = static_cast<float>(memory::peak_bytes() / 1024);
  slot[slots.stop()] = stop_requested() ? 1.0f : 0.0f;
  gradients->write_slots(slot.data());
  if (local_loss.defined())
    gradients->slot(static_cast<std::int64_t>(slots.loss())).copy_(local_loss.reshape({1}));

  memory::synchronize_device();  // NCCL runs on its own stream (timed apart: it waits for backward)
  const auto reduce_start = Clock::now();
  data_comm().allreduce_sum(gradients->buffer().data_ptr<float>(),
                            static_cast<std::size_t>(gradients->buffer().numel()));
  allreduce_seconds += seconds_since(reduce_start);
  gradients->read_slots(slot.data());

  for (int r = 0; r < world; ++r) {
    auto& peak = peak_bytes[static_cast<std::size_t>(r)];
    peak = std::max(peak, static_cast<std::int64_t>(slot[slots.peak_kib(r)]) * 1024);
  }
  loss = slot[slots.loss()];
  for (int r = 0; r < world; ++r) {
    if (slot[slots.oom(r)] > 0) return false;
  }
  return true;
}

void Trainer::State::evaluate() {
  if (!val_reader) return;
  torch::NoGradGuard no_grad;
  model->set_training(false);
  const data::RowRange part = data::BatchPlan::rank_part(val_reader->schema().rows, world, rank);
  std::int64_t m = options.eval_micro_batch > 0
                       ? options.eval_micro_batch
                       : std::max<std::int64_t>(policy->current() * 4, 256);
  double totals[3] = {0, 0, 0};  // loss sum, correct, rows
  // Evaluation has no collective inside, so each rank halves on its own after an OOM. Each
  // micro-batch is read as its own slab, so the read also shrinks with m.
  for (std::int64_t first = part.begin; first < part.end;) {
    try {
      const data::Batch micro = val_reader->read(first, std::min(part.end, first + m));
      std::vector<at::Tensor> inputs;
      for (std::size_t i = 0; i + 1 < micro.size(); ++i)
        inputs.push_back(on_device(micro[i]));
      at::Tensor output = model->forward(inputs);
      const at::Tensor target = on_device(micro[micro.size() - 1]);
      totals[0] += loss_of(output, target, 1).item<double>();
      if (classification) totals[1] += output.argmax(1).eq(target).sum().item<double>();
      totals[2] += static_cast<double>(micro.rows());
      first += micro.rows();
    } catch (const std::exception& e) {
      if (!memory::is_out_of_memory(e) || m == 1) throw;
      m = std::max<std::int64_t>(m / 2, 1);
      memory::release_cached_memory();
    }
  }
  model->set_training(true);
  comm.allreduce_sum_host(totals, 3);
  const double loss = totals[0] / std::max(totals[2], 1.0);
  const double accuracy = classification ? totals[1] / std::max(totals[2], 1.0) : std::nan("");
  result.eval_loss = loss;
  result.eval_accuracy = classification ? std::optional<double>(accuracy) : std::nullopt;
  if (run_log) run_log->add(io::EvalRow{step, loss, accuracy});
  char line[160];
  if (classification) {
    std::snprintf(line, sizeof line, "eval  step %lld  loss %.4f  accuracy %.4f  (%lld rows)",
                  static_cast<long long>(step), loss, accuracy, static_cast<long long>(totals[2]));
  } else {
    std::snprintf(line, sizeof line, "eval  step %lld  mse %.6f  (%lld rows)",
                  static_cast<long long>(step), loss, static_cast<long long>(totals[2]));
  }
  say(line);
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
  return state_->gradients->gradients().clone();
}

TrainResult Trainer::run() {
  try {
    return run_steps();
  } catch (const CollectiveError& e) {
    state_->write_log("failed", e.what());  // every rank threw it; only rank 0 has the log
    throw;
  }
}

TrainResult Trainer::run_steps() {
  State& s = *state_;
  const auto& o = s.options;
  const std::int64_t per_epoch = s.plan->batches_per_epoch();
  const int rank = s.rank;
  data::Prefetcher prefetcher(
      [&s, per_epoch, rank](std::int64_t global_step) {
        const memory::UncountedScope staging;  // host staging, as pinned memory on a GPU
        const data::RowRange rows =
            s.plan->rank_rows(global_step / per_epoch, global_step % per_epoch, rank);
        return s.reader->read(rows.begin, rows.end);
      },
      s.step, s.total_steps);

  const auto run_start = Clock::now();
  const std::int64_t first_step = s.step;
  double last_loss = 0;
  auto fail_run = [&](const std::string& message, ExitCode code) {
    s.write_log("failed", message);
    throw CollectiveError(message, code, 0);
  };

  while (s.step < s.total_steps) {
    const auto step_start = Clock::now();
    const double waited_before = prefetcher.waited_seconds();
    const data::Batch slab = prefetcher.next();
    const double data_wait = prefetcher.waited_seconds() - waited_before;
    std::int64_t retries = 0;
    double loss = 0;
    s.allreduce_seconds = 0;
    double retry_seconds = 0;
    for (;;) {
      const std::int64_t m = s.policy->current();
      const auto attempt_start = Clock::now();
      if (s.attempt(slab, m, loss)) break;
      retry_seconds += seconds_since(attempt_start);
      // Every rank saw the same flags: decide together.
      std::vector<int> failed;
      for (int r = 0; r < s.world; ++r) {
        if (s.slot[s.slots.oom(r)] > 0) failed.push_back(r);
      }
      const bool probe = s.policy->probing();
      const std::optional<std::int64_t> next = s.policy->after_oom();
      ++retries;
      s.result.oom_events += static_cast<std::int64_t>(failed.size());
      std::ostringstream who;
      for (std::size_t i = 0; i < failed.size(); ++i)
        who << (i ? ", " : "") << failed[i];
      std::int64_t worst_peak = 0;
      for (int r : failed)
        worst_peak = std::max(worst_peak, s.peak_bytes[static_cast<std::size_t>(r)]);
      if (s.run_log) {
        for (int r : failed)
          s.run_log->add(io::OomRow{s.step, r, m, next.value_or(0)});
      }
      const std::string limit = o.memory_limit > 0
                                    ? memory::format_bytes(o.memory_limit) + " per rank"
                                    : std::string("no --memory-limit");
      if (!next) {
        std::ostringstream message;
        message << (failed.size() > 1 ? "ranks " : "rank ") << who.str()
                << " ran out of memory at micro-batch " << m << " (limit " << limit << ", peak "
                << memory::format_bytes(worst_peak) << ") at step " << s.step << ": ";
        if (s.policy->automatic()) {
          message << "the model does not fit even at micro-batch 1; raise --memory-limit, use more "
                     "ranks or a smaller model";
        } else {
          message << "--micro-batch " << m
                  << " is fixed; use --micro-batch auto to let autoaccum find a size that fits";
        }
        fail_run(message.str(), ExitCode::kOutOfMemory);
      }
      memory::release_cached_memory();
      s.say(std::string(failed.size() > 1 ? "ranks " : "rank ") + who.str() +
            " ran out of memory at micro-batch " + std::to_string(m) + (probe ? " (a probe)" : "") +
            " (limit " + limit + "); all " + std::to_string(s.world) + " ranks continue at " +
            std::to_string(*next));
    }

    const bool stop = s.slot[s.slots.stop()] > 0;
    at::Tensor grads = s.gradients->gradients();
    // Every rank sees the same reduced loss and gradients, so a NaN or Inf on any rank is seen
    // by all, and all take the same decision. One read-only pass: the sum (or, when clipping,
    // the norm the clipping needs anyway) is NaN or Inf when any element is.
    const double norm = o.clip_grad_norm > 0 ? grads.norm().item<double>() : 0.0;
    const double total = o.clip_grad_norm > 0 ? norm : grads.sum().item<double>();
    const bool finite = std::isfinite(loss) && std::isfinite(total);
    if (!finite && o.on_nonfinite != "skip") {
      fail_run("non-finite loss or gradient at step " + std::to_string(s.step) + " (loss " +
                   std::to_string(loss) +
                   "); lower --lr, set --clip-grad-norm, or --on-nonfinite skip",
               ExitCode::kInternal);
    }
    const double lr = s.schedule.lr(s.step);
    if (!finite) {
      ++s.result.skipped_steps;
      s.say("step " + std::to_string(s.step) +
            ": non-finite loss or gradient on some rank; step skipped (" +
            std::to_string(s.result.skipped_steps) + " so far)");
    } else {
      if (o.clip_grad_norm > 0 && norm > o.clip_grad_norm)
        grads.mul_(o.clip_grad_norm / (norm + 1e-6));
      for (auto& group : s.optimizer->param_groups())
        group.options().set_lr(lr);
      try {
        s.optimizer->step();
      } catch (const std::exception& e) {
        if (!memory::is_out_of_memory(e)) throw;
        // The optimizer's state does not shrink with the micro-batch: nothing to retry.
        throw Error(
            "rank " + std::to_string(s.rank) + ": out of memory in the optimizer step (limit " +
                memory::format_bytes(o.memory_limit) + "): the optimizer state does not fit",
            ExitCode::kOutOfMemory);
      }
    }
    ++s.step;
    last_loss = loss;
    const double step_seconds = seconds_since(step_start);
    const std::int64_t rank0_rows = data::BatchPlan::rank_part(o.global_batch, s.world, 0).size();
    if (s.run_log) {
      io::StepRow row;
      row.step = s.step - 1;
      row.epoch = (s.step - 1) / per_epoch;
      row.micro_batch = s.policy->current();
      row.accumulation = s.policy->accumulation(rank0_rows);
      row.loss = loss;
      row.lr = lr;
      row.step_seconds = step_seconds;
      row.samples_per_second = static_cast<double>(o.global_batch) / step_seconds;
      row.oom_retries = retries;
      row.skipped = finite ? 0 : 1;
      row.data_wait_seconds = data_wait;
      row.peak_bytes = *std::max_element(s.peak_bytes.begin(), s.peak_bytes.end());
      row.live_bytes = memory::live_bytes();
      row.allreduce_seconds = s.allreduce_seconds;
      row.retry_seconds = retry_seconds;
      s.run_log->add(row);
      ++s.steps_since_flush;
      // Every 10 steps but at most once a second (fast steps would otherwise spend much of
      // their time flushing), at least every 5 s, and at once after a retry.
      const double since_flush = seconds_since(s.last_flush);
      if (retries > 0 || (s.steps_since_flush >= 10 && since_flush >= 1.0) || since_flush > 5.0) {
        s.write_log();
        s.steps_since_flush = 0;
        s.last_flush = Clock::now();
      }
    }
    if (o.log_every > 0 &&
        (s.step % o.log_every == 0 || s.step == s.total_steps || s.step == first_step + 1)) {
      const double elapsed = seconds_since(run_start);
      const double rate = static_cast<double>((s.step - first_step) * o.global_batch) / elapsed;
      const double eta = elapsed / static_cast<double>(s.step - first_step) *
                         static_cast<double>(s.total_steps - s.step);
      char line[200];
      std::snprintf(line, sizeof line,
                    "step %lld/%lld  loss %.4f  lr %.4g  m %lld x %lld  %s samples/s  ETA %s",
                    static_cast<long long>(s.step), static_cast<long long>(s.total_steps), loss, lr,
                    static_cast<long long>(s.policy->current()),
                    static_cast<long long>(s.policy->accumulation(rank0_rows)),
                    rate_text(rate).c_str(), duration_text(eta).c_str());
      s.say(line);
    }
    if (o.eval_every > 0 && s.step % o.eval_every == 0 && s.step < s.total_steps) s.evaluate();
    if (o.checkpoint_every > 0 && s.step % o.checkpoint_every == 0 && s.step < s.total_steps)
      s.save_checkpoint();
    if (stop && s.step < s.total_steps) {
      s.save_checkpoint();
      s.write_log("preempted");
      s.say("autoaccum: stopped by a signal at step " + std::to_string(s.step) +
            (o.checkpoint.empty() ? std::string(" (no --checkpoint given: progress is lost)")
                                  : "; checkpoint written to " + o.checkpoint));
      s.result.preempted = true;
      break;
    }
    // --micro-batch-search refine: perhaps a larger size to try at the next step.
    if (s.step < s.total_steps && s.policy->after_success())
      s.say("probing micro-batch " + std::to_string(s.policy->current()) + " at step " +
            std::to_string(s.step));
  }

  if (!s.result.preempted) {
    s.evaluate();
    s.save_checkpoint();
    s.write_log("completed");
  }
  s.result.steps_done = s.step;
  s.result.final_micro_batch = s.policy->current();
  s.result.final_loss = last_loss;
  return s.result;
}

}  // namespace autoaccum::train
