// Checkpoint files as a whole: the room reserved, which datasets and attributes go in, reading
// the newest whole one back (each kind of dataset is written and verified in
// checkpoint_datasets.cpp; the kept older files are named and rotated in checkpoint_files.cpp).
#include "autoaccum/io/checkpoint.hpp"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/checksum.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/checksums.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "checkpoint_datasets.hpp"
#include "checkpoint_files.hpp"

namespace autoaccum::io {
namespace {

constexpr const char* kFormat = kCheckpointFormat;

// An upper bound of the file's size: its data, and what HDF5 adds (measured: about 8 KiB, 220
// bytes per dataset for 400 datasets, 1.1 KiB per dataset for 12; here 8 KiB + 1 KiB per
// dataset + the attributes' bytes twice).
std::int64_t size_bound(const Checkpoint& c, std::int64_t optimizer_bytes) {
  std::int64_t data = optimizer_bytes;
  std::int64_t datasets = 9;  // optimizer/state, the 4 integer lists, the memory models, spare
  std::int64_t names = 0;
  for (const auto& t : c.streamed_optimizer) {
    std::int64_t numel = 1;
    for (const std::int64_t extent : t.shape)
      numel *= extent;
    data += 4 * numel;
    names += 2 * (static_cast<std::int64_t>(t.name.size()) + 1);
    ++datasets;
  }
  for (const auto* list : {&c.params, &c.buffers}) {
    for (const auto& [name, tensor] : *list) {
      data += stored_bytes(tensor);
      names += static_cast<std::int64_t>(name.size()) + 1;
      ++datasets;
    }
  }
  for (const auto& state : c.generator_states) {
    data += static_cast<std::int64_t>(state.size());
    ++datasets;
  }
  data += 8 * static_cast<std::int64_t>(c.micro_batches.size() + c.shares.size() +
                                        c.shares_after.size() + c.shares_followed.size());
  for (const auto& m : c.memory_models)  // 4 doubles a point, 3 a rank
    data += 8 * static_cast<std::int64_t>(m.points.size() / 3 * 4 + 3);
  data += 8 * 3 * static_cast<std::int64_t>(c.time_fits.size());
  std::int64_t longest = 0;  // the name lists are fixed-width strings
  for (const auto* list : {&c.params, &c.buffers})
    for (const auto& named : *list)
      longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(named.first.size()) + 1);
  const auto listed = static_cast<std::int64_t>(c.params.size() + c.buffers.size());
  std::int64_t attributes = 1024 + listed * longest + names;
  for (const auto& f : c.replica_fingerprints)
    attributes += static_cast<std::int64_t>(f.size()) + 1;
  for (const auto& f : c.data.files)
    attributes += static_cast<std::int64_t>(f.size()) + 1;
  // A checksum attribute is about 100 bytes of each dataset's header (within the 1 KiB).
  return data + 8192 + 1024 * datasets + 2 * attributes;
}

// The parameters, buffers and optimizer state, with the lists of their names.
void write_tensors(hdf5::File& file, const Checkpoint& c, std::int64_t optimizer_bytes,
                   const WrittenSums& sums) {
  std::vector<std::string> param_names, buffer_names;
  for (const auto& [name, tensor] : c.params) {
    write_tensor(file, "params/" + name, tensor, sums);
    param_names.push_back(name);
  }
  for (const auto& [name, tensor] : c.buffers) {
    write_tensor(file, "buffers/" + name, tensor, sums);
    buffer_names.push_back(name);
  }
  if (c.stream_optimizer || !c.optimizer.empty()) write_optimizer(file, c, optimizer_bytes, sums);
  std::vector<std::string> optimizer_names;
  for (const auto& t : c.streamed_optimizer) {
    write_streamed(file, t, sums);
    optimizer_names.push_back(t.name);
  }
  file.write_attribute("params_names", param_names);
  file.write_attribute("buffers_names", buffer_names);
  if (!c.optimizer_kind.empty()) {
    file.write_attribute("optimizer_kind", c.optimizer_kind);
    file.write_attribute("optimizer_step", c.optimizer_step);
    if (!optimizer_names.empty()) file.write_attribute("optimizer_names", optimizer_names);
  }
}

// The root's attributes: the step, the run's settings and the data order it was trained in.
void write_attributes(hdf5::File& file, const Checkpoint& c) {
  file.write_attribute("format", std::string(kFormat));
  file.write_attribute("step", c.step);
  file.write_attribute("epoch", c.epoch);
  file.write_attribute("micro_batch", c.micro_batch);
  file.write_attribute("world_size", c.world_size);
  file.write_attribute("seed", static_cast<std::int64_t>(c.seed));
  file.write_attribute("loss_scale", c.loss_scale);
  file.write_attribute("loss_scale_clean_steps", c.loss_scale_clean_steps);
  if (!c.replica_fingerprints.empty())
    file.write_attribute("replica_fingerprints", c.replica_fingerprints);
  if (c.data.global_batch > 0) {
    file.write_attribute("data_global_batch", c.data.global_batch);
    if (c.data.global_batch_tokens > 0)
      file.write_attribute("data_global_batch_tokens", c.data.global_batch_tokens);
    file.write_attribute("data_shuffle", c.data.shuffle);
    file.write_attribute("data_rows", c.data.rows);
    file.write_attribute("data_files", c.data.files);
    file.write_attribute("data_fingerprint", c.data.fingerprint);
    file.write_attribute("data_batch_in_epoch", c.data.batch_in_epoch);
  }
}

// The root attributes and the small datasets beside them (sizes, shares, the memory and time
// models).
void read_attributes(hdf5::File& file, Verifier& verifier, Checkpoint& c) {
  c.step = file.read_int_attribute("step");
  c.epoch = file.read_int_attribute("epoch");
  c.micro_batch = file.read_int_attribute("micro_batch");
  c.micro_batches = read_integers(file, "micro_batches", verifier);
  c.shares = read_integers(file, "shares", verifier);
  c.shares_after = read_integers(file, "shares_after", verifier);
  c.shares_followed = read_integers(file, "shares_followed", verifier);
  c.memory_models = read_memory_models(file, verifier, c.time_fits);
  read_time_fits(file, verifier, c.time_fits);
  c.world_size = file.read_int_attribute("world_size");
  c.seed = static_cast<std::uint64_t>(file.read_int_attribute("seed"));
  if (file.has_attribute("loss_scale")) {
    const hdf5::AttributeValue scale = file.attribute_value("loss_scale");
    if (const double* value = std::get_if<double>(&scale)) c.loss_scale = *value;
    c.loss_scale_clean_steps = file.read_int_attribute("loss_scale_clean_steps");
  }
  if (file.has_attribute("replica_fingerprints"))
    c.replica_fingerprints = file.read_string_list_attribute("replica_fingerprints");
  if (file.has_attribute("data_global_batch")) {
    c.data.global_batch = file.read_int_attribute("data_global_batch");
    if (file.has_attribute("data_global_batch_tokens"))
      c.data.global_batch_tokens = file.read_int_attribute("data_global_batch_tokens");
    c.data.shuffle = file.read_string_attribute("data_shuffle");
    c.data.rows = file.read_int_attribute("data_rows");
    c.data.files = file.read_string_list_attribute("data_files");
    c.data.fingerprint = file.read_string_attribute("data_fingerprint");
    c.data.batch_in_epoch = file.read_int_attribute("data_batch_in_epoch");
  }
}

// The tensors: buffers, generator states and LibTorch's archive read whole; the parameters read
// whole or left in the file (`parameters`), the per-parameter optimizer state left in it.
void read_tensors(hdf5::File& file, const std::string& path, Verifier& verifier,
                  Parameters parameters, Checkpoint& c) {
  // Left in the file (a second handle, kept by the tensors' readers): the parameters where
  // the caller reads them into its model, and the optimizer state, each rank its own slice.
  std::shared_ptr<hdf5::File> kept;
  const auto keep = [&] {
    if (!kept) kept = std::make_shared<hdf5::File>(hdf5::File::open(path));
    return kept;
  };
  for (const auto& name : names_under(file, "params")) {
    if (parameters == Parameters::kInFile &&
        file.dataset("params/" + name).dtype() == hdf5::DType::kFloat32) {
      c.stored_params.push_back(stored_tensor(keep(), "params/" + name, verifier));
      c.stored_params.back().name = name;
    } else {
      c.params.emplace_back(name, read_tensor(file, "params/" + name, verifier));
    }
  }
  for (const auto& name : names_under(file, "buffers")) {
    c.buffers.emplace_back(name, read_tensor(file, "buffers/" + name, verifier));
  }
  const std::int64_t rng_ranks =
      file.has_attribute("rng_ranks") ? file.read_int_attribute("rng_ranks") : 0;
  for (std::int64_t r = 0; r < rng_ranks; ++r)
    c.generator_states.push_back(read_bytes(file, "rng/rank" + std::to_string(r), verifier));
  if (file.has_dataset("optimizer/state"))
    c.optimizer = read_bytes(file, "optimizer/state", verifier);
  if (file.has_attribute("optimizer_kind")) {
    c.optimizer_kind = file.read_string_attribute("optimizer_kind");
    c.optimizer_step = file.read_int_attribute("optimizer_step");
    for (const auto& name : names_under(file, "optimizer")) {
      c.optimizer_state.push_back(stored_tensor(keep(), "optimizer/" + name, verifier));
      c.optimizer_state.back().name = name;
    }
  }
}

}  // namespace

std::int64_t write_checkpoint(const std::string& path, const Checkpoint& c, int keep,
                              Checksums checksums) {
  if (keep < 1) throw UsageError("--keep-checkpoints must be at least 1");
  const WrittenSums sums{checksums == Checksums::kOn};
  std::int64_t written = 0;
  write_atomically(path, [&](const std::string& temporary) {
    const std::int64_t optimizer_bytes = optimizer_size(c);
    const std::int64_t bound = size_bound(c, optimizer_bytes);
    // Room first, before HDF5 has anything to write: HDF5 1.14 can crash closing a file whose
    // writes failed on a full disk. The reserved blocks take every later write.
    check_free_space(temporary, static_cast<std::uint64_t>(bound));
    auto file = hdf5::File::create(temporary);
    reserve_space(temporary, static_cast<std::uint64_t>(bound));
    write_tensors(file, c, optimizer_bytes, sums);
    for (std::size_t r = 0; r < c.generator_states.size(); ++r)
      write_bytes(file, "rng/rank" + std::to_string(r), c.generator_states[r], sums);
    file.write_attribute("rng_ranks", static_cast<std::int64_t>(c.generator_states.size()));
    write_integers(file, "micro_batches", c.micro_batches, sums);
    write_integers(file, "shares", c.shares, sums);
    write_integers(file, "shares_after", c.shares_after, sums);
    write_integers(file, "shares_followed", c.shares_followed, sums);
    write_memory_models(file, c.memory_models, sums);
    write_time_fits(file, c.time_fits, sums);
    write_attributes(file, c);
    // Last: the root's checksum covers every attribute above.
    if (sums.on) file.write_attribute(kChecksumAttribute, hdf5::attributes_checksum(file));
    file.close();
    written = release_reserve(temporary);
    // The new one is complete: keep the current one under its step's name before it is
    // replaced.
    if (keep > 1) keep_current(path);
  });
  remove_beyond(path, keep);
  return written;
}

std::optional<LoadedCheckpoint> read_latest_checkpoint(const std::string& path,
                                                       Parameters parameters) {
  std::vector<std::string> candidates;
  const bool have_newest = ::access(path.c_str(), F_OK) == 0;
  if (have_newest) candidates.push_back(path);
  for (const auto& older : older_checkpoints(path))
    candidates.push_back(older);
  if (candidates.empty()) return std::nullopt;
  // Any failure to read one goes on to the next: a checksum, HDF5's (a truncated file),
  // LibTorch's (a tensor it cannot make), or memory running out while reading.
  LoadedCheckpoint loaded;
  if (!have_newest)
    loaded.skipped.push_back({"", "'" + path +
                                      "' is missing (removed, or a kill on a file system without "
                                      "hard links)"});
  for (const auto& candidate : candidates) {
    try {
      loaded.checkpoint = read_checkpoint(candidate, Checksums::kOn, parameters);
      loaded.path = candidate;
      return loaded;
    } catch (const std::exception& e) {
      loaded.skipped.push_back({candidate, e.what()});
    }
  }
  std::string all;
  for (const auto& skipped : loaded.skipped)
    all += (all.empty() ? "" : "; ") + skipped.why;
  throw CheckpointDamaged("--resume: no checkpoint of '" + path + "' reads whole: " + all);
}

Checkpoint read_checkpoint(const std::string& path, Checksums verify, Parameters parameters) {
  try {
    auto file = hdf5::File::open(path);
    if (!file.has_attribute("format") || file.read_string_attribute("format") != kFormat) {
      throw CheckpointDamaged("checkpoint '" + path + "' is not an autoaccum checkpoint");
    }
    Verifier verifier(file, path, verify == Checksums::kOn);
    Checkpoint c;
    read_attributes(file, verifier, c);
    read_tensors(file, path, verifier, parameters, c);
    c.verified = verifier.verified();
    c.verified_datasets = verifier.checked();
    return c;
  } catch (const CheckpointDamaged&) {
    throw;
  } catch (const InputError& e) {
    // HDF5's own failures: a truncated file, a dataset missing.
    throw CheckpointDamaged("checkpoint '" + path + "' cannot be read: " + e.what());
  }
}

void read_stored(const Checkpoint::StoredTensor& stored, std::int64_t from, at::Tensor out) {
  constexpr std::int64_t kPieceFloats = std::int64_t{4} << 20;  // 16 MiB
  const std::int64_t n = out.numel();
  if (out.device().is_cpu() && out.is_contiguous() && out.scalar_type() == at::kFloat) {
    stored.read(from, n, out.data_ptr<float>());
    return;
  }
  std::vector<float> host(static_cast<std::size_t>(std::min(n, kPieceFloats)));
  for (std::int64_t done = 0; done < n; done += kPieceFloats) {
    const std::int64_t count = std::min(kPieceFloats, n - done);
    stored.read(from + done, count, host.data());
    out.narrow(0, done, count).copy_(at::from_blob(host.data(), {count}, at::kFloat));
  }
}

std::int64_t Checkpoint::StoredTensor::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape)
    n *= d;
  return n;
}

}  // namespace autoaccum::io
