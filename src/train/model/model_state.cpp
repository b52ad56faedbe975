// ModelState: buffer snapshots, mean buffer changes, generator states.
#include "autoaccum/train/model/model_state.hpp"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "autoaccum/comm/exact_slots.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/core/splitmix.hpp"

namespace autoaccum::train {
namespace {

bool averaged(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return at::isFloatingType(type) || (at::isIntegralType(type, /*includeBool=*/false));
}

// Floats a reduced buffer takes in the all-reduce (see reduce_count()).
std::int64_t slots_of(const at::Tensor& buffer, int world) {
  return buffer.scalar_type() == at::kDouble
             ? buffer.numel() * static_cast<std::int64_t>(comm::kExactSlots) * world
             : buffer.numel();
}

}  // namespace

ModelState::ModelState(Model& model, c10::Device device, int world, int rank)
    : world_(world), rank_(rank) {
  std::vector<const c10::TensorImpl*> seen;
  for (auto& [name, tensor] : model.named_buffers()) {
    if (std::find(seen.begin(), seen.end(), tensor.unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(tensor.unsafeGetTensorImpl());
    buffers_.push_back(tensor);
    saved_.push_back(at::empty_like(tensor));
    reduced_.push_back(averaged(tensor));
    if (reduced_.back()) {
      reduce_count_ += slots_of(tensor, world_);
      averaged_values_ += tensor.numel();
    }
  }
  generator_devices_.push_back(c10::Device(c10::kCPU));
  if (device.is_cuda()) generator_devices_.push_back(device);
  for (const auto& d : generator_devices_) {
    (void)d;
    saved_generators_.emplace_back();
  }
}

void ModelState::capture() {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    saved_[i].copy_(buffers_[i]);
  for (std::size_t i = 0; i < generator_devices_.size(); ++i) {
    auto generator = at::globalContext().defaultGenerator(generator_devices_[i]);
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved_generators_[i] = generator.get_state();
  }
}

void ModelState::restore() {
  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    buffers_[i].copy_(saved_[i]);
  for (std::size_t i = 0; i < generator_devices_.size(); ++i) {
    if (!saved_generators_[i].defined()) continue;
    auto generator = at::globalContext().defaultGenerator(generator_devices_[i]);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved_generators_[i]);
  }
}

void ModelState::write_changes(at::Tensor region) const {
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (!reduced_[i]) continue;
    const std::int64_t n = buffers_[i].numel();
    const std::int64_t slots = slots_of(buffers_[i], world_);
    at::Tensor slot = region.narrow(0, offset, slots);
    if (buffers_[i].scalar_type() == at::kFloat) {
      slot.copy_(buffers_[i].reshape({n}));  // in place: no temporary per step
      slot.sub_(saved_[i].reshape({n}));
    } else if (buffers_[i].scalar_type() == at::kDouble) {
      // The change (exact in double) as float pieces in this rank's slots; the other ranks'
      // stay zero.
      slot.zero_();
      slot.narrow(0, static_cast<std::int64_t>(comm::kExactSlots) * n * rank_,
                  static_cast<std::int64_t>(comm::kExactSlots) * n)
          .copy_(exact_pieces(buffers_[i] - saved_[i]));
    } else {
      slot.copy_((buffers_[i] - saved_[i]).reshape({n}));  // exact for integers below 2^24
    }
    offset += slots;
  }
}

void ModelState::apply_mean_change(const at::Tensor& reduced) {
  if (world_ <= 1) return;  // the rank's own change is the mean
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (!reduced_[i]) continue;
    at::Tensor& buffer = buffers_[i];
    const std::int64_t n = buffer.numel();
    const std::int64_t slots = slots_of(buffer, world_);
    const at::Tensor region = reduced.narrow(0, offset, slots);
    offset += slots;
    if (buffer.scalar_type() == at::kDouble) {
      // Every rank's exact change, added up on the host in rank order: the same bits on every
      // rank whatever its threads or device.
      const at::Tensor pieces = region.to(at::kCPU).contiguous();
      const float* p = pieces.data_ptr<float>();
      at::Tensor mean = at::empty({n}, at::TensorOptions().dtype(at::kDouble));
      double* m = mean.data_ptr<double>();
      for (std::int64_t e = 0; e < n; ++e) {
        double sum = 0.0;
        for (int r = 0; r < world_; ++r)
          sum += comm::read_exact(p + comm::kExactSlots * (r * n + e));
        m[e] = sum / world_;
      }
      buffer.copy_(saved_[i] + mean.to(buffer.device()).view(buffer.sizes()));
      continue;
    }
    const at::Tensor change = region.view(buffer.sizes());
    buffer.copy_(saved_[i]);
    if (at::isFloatingType(buffer.scalar_type())) {
      buffer.add_(change.to(buffer.scalar_type()), 1.0 / world_);
    } else {
      buffer.add_(change.div(world_).round_().to(buffer.scalar_type()));
    }
  }
}

at::Tensor exact_pieces(const at::Tensor& values) {
  static_assert(comm::kExactSlots == 3, "high, middle and low pieces");
  const at::Tensor v = values.to(at::kDouble).reshape({-1});
  const at::Tensor high = v.to(at::kFloat);
  const at::Tensor rest = v - high.to(at::kDouble);
  const at::Tensor middle = rest.to(at::kFloat);
  const at::Tensor low = (rest - middle.to(at::kDouble)).to(at::kFloat);
  return at::stack({high, middle, low}, 1).reshape({-1});
}

std::string ModelState::generator_state() const {
  std::string bytes;
  for (const auto& device : generator_devices_) {
    auto generator = at::globalContext().defaultGenerator(device);
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state().contiguous().cpu();
    }
    const auto size = static_cast<std::uint64_t>(state.nbytes());
    bytes.append(reinterpret_cast<const char*>(&size), sizeof size);
    bytes.append(static_cast<const char*>(state.data_ptr()), static_cast<std::size_t>(size));
  }
  return bytes;
}

std::size_t ModelState::set_generator_state(const std::string& bytes, std::uint64_t fallback_seed) {
  std::size_t at = 0;
  std::size_t set = 0;
  for (const auto& device : generator_devices_) {
    std::uint64_t size = 0;
    if (at == bytes.size() && set > 0) {
      // Written where this device was not in use (the CPU's stream alone): a fresh stream.
      auto generator = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(fallback_seed);
      continue;
    }
    if (at + sizeof size > bytes.size())
      throw InputError("the checkpoint's random-number state is too short for this run");
    std::memcpy(&size, bytes.data() + at, sizeof size);
    at += sizeof size;
    if (at + size > bytes.size())
      throw InputError("the checkpoint's random-number state is truncated");
    at::Tensor state = at::empty({static_cast<std::int64_t>(size)}, at::kByte);
    std::memcpy(state.data_ptr(), bytes.data() + at, size);
    at += size;
    auto generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    try {
      generator.set_state(state);
    } catch (const c10::Error& e) {
      throw InputError("the checkpoint's random-number state does not fit this device's generator");
    }
    ++set;
  }
  return set;
}

std::uint64_t rank_seed(std::uint64_t seed, int rank) noexcept {
  std::uint64_t state = seed ^ (0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(rank + 1));
  return splitmix64(state);
}

void seed_generators_for_rank(std::uint64_t seed, int rank) {
  at::manual_seed(rank_seed(seed, rank));  // the CPU's generator and every GPU's
}

}  // namespace autoaccum::train
