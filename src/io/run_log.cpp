// RunLogWriter / read_run_log: the whole log rewritten atomically at each flush.
#include "autoaccum/io/run_log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <variant>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::io {
namespace {

constexpr std::int64_t kChunkRows = 256;

// Each group's columns, in file order, with the row member each one holds. The schema
// (run_log_schema(), the datasets created) and the writer both come from these tables.
template <class Row>
struct Field {
  const char* name;
  std::variant<std::int64_t Row::*, double Row::*> member;
  bool integer() const { return std::holds_alternative<std::int64_t Row::*>(member); }
};

const std::vector<Field<StepRow>>& step_fields() {
  static const std::vector<Field<StepRow>> fields = {
      {"step", &StepRow::step},
      {"epoch", &StepRow::epoch},
      {"micro_batch", &StepRow::micro_batch},
      {"accumulation", &StepRow::accumulation},
      {"loss", &StepRow::loss},
      {"lr", &StepRow::lr},
      {"step_seconds", &StepRow::step_seconds},
      {"samples_per_second", &StepRow::samples_per_second},
      {"oom_retries", &StepRow::oom_retries},
      {"data_wait_seconds", &StepRow::data_wait_seconds},
      {"peak_bytes", &StepRow::peak_bytes},
      {"skipped", &StepRow::skipped},
      {"live_bytes", &StepRow::live_bytes},
      {"allreduce_seconds", &StepRow::allreduce_seconds},
      {"retry_seconds", &StepRow::retry_seconds},
      {"loss_scale", &StepRow::loss_scale},
      {"data_cpu_seconds", &StepRow::data_cpu_seconds},
      {"tokens", &StepRow::tokens},
      {"padded_tokens", &StepRow::padded_tokens},
      {"compute_seconds", &StepRow::compute_seconds},
      {"predicted_compute_seconds", &StepRow::predicted_compute_seconds},
      {"accumulation_max", &StepRow::accumulation_max},
      {"accumulation_max_rank", &StepRow::accumulation_max_rank}};
  return fields;
}
const std::vector<Field<OomRow>>& oom_fields() {
  static const std::vector<Field<OomRow>> fields = {
      {"step", &OomRow::step},
      {"rank", &OomRow::rank},
      {"micro_batch", &OomRow::micro_batch},
      {"next_micro_batch", &OomRow::next_micro_batch}};
  return fields;
}
const std::vector<Field<EvalRow>>& eval_fields() {
  static const std::vector<Field<EvalRow>> fields = {
      {"step", &EvalRow::step}, {"loss", &EvalRow::loss}, {"accuracy", &EvalRow::accuracy}};
  return fields;
}
const std::vector<Field<CheckpointRow>>& checkpoint_fields() {
  static const std::vector<Field<CheckpointRow>> fields = {{"step", &CheckpointRow::step},
                                                           {"bytes", &CheckpointRow::bytes},
                                                           {"seconds", &CheckpointRow::seconds}};
  return fields;
}
const std::vector<Field<ResumeRow>>& resume_fields() {
  static const std::vector<Field<ResumeRow>> fields = {
      {"step", &ResumeRow::step},
      {"dropped_steps", &ResumeRow::dropped_steps},
      {"world_size", &ResumeRow::world_size},
      {"global_batch", &ResumeRow::global_batch},
      {"reshaped", &ResumeRow::reshaped},
      {"skipped_checkpoints", &ResumeRow::skipped_checkpoints}};
  return fields;
}

const std::vector<Field<RankSizeRow>>& rank_size_fields() {
  static const std::vector<Field<RankSizeRow>> fields = {{"step", &RankSizeRow::step},
                                                         {"rank", &RankSizeRow::rank},
                                                         {"micro_batch", &RankSizeRow::micro_batch},
                                                         {"rows", &RankSizeRow::rows}};
  return fields;
}

const std::vector<Field<MemoryModelRow>>& memory_model_fields() {
  static const std::vector<Field<MemoryModelRow>> fields = {
      {"step", &MemoryModelRow::step},
      {"rank", &MemoryModelRow::rank},
      {"limit_bytes", &MemoryModelRow::limit_bytes},
      {"fixed_bytes", &MemoryModelRow::fixed_bytes},
      {"bytes_per_unit", &MemoryModelRow::bytes_per_unit},
      {"bytes_per_square", &MemoryModelRow::bytes_per_square},
      {"margin", &MemoryModelRow::margin},
      {"predicted", &MemoryModelRow::predicted},
      {"micro_batch", &MemoryModelRow::micro_batch},
      {"probe_attempts", &MemoryModelRow::probe_attempts},
      {"probe_seconds", &MemoryModelRow::probe_seconds}};
  return fields;
}

const std::vector<Field<TimeModelRow>>& time_model_fields() {
  static const std::vector<Field<TimeModelRow>> fields = {
      {"step", &TimeModelRow::step},
      {"rank", &TimeModelRow::rank},
      {"fixed_seconds", &TimeModelRow::fixed_seconds},
      {"seconds_per_token", &TimeModelRow::seconds_per_token},
      {"seconds_per_square", &TimeModelRow::seconds_per_square},
      {"cost_fixed", &TimeModelRow::cost_fixed},
      {"cost_width", &TimeModelRow::cost_width},
      {"micro_batch", &TimeModelRow::micro_batch},
      {"fit_error", &TimeModelRow::fit_error},
      {"predicted_step_seconds", &TimeModelRow::predicted_step_seconds},
      {"half_budget_step_seconds", &TimeModelRow::half_budget_step_seconds},
      {"probe_attempts", &TimeModelRow::probe_attempts},
      {"probe_seconds", &TimeModelRow::probe_seconds}};
  return fields;
}

struct ColumnSpec {
  std::string name;
  bool integer;
};

template <class Row>
std::vector<ColumnSpec> columns_of(const std::vector<Field<Row>>& fields) {
  std::vector<ColumnSpec> out;
  for (const auto& f : fields)
    out.push_back({f.name, f.integer()});
  return out;
}

const std::vector<std::pair<std::string, std::vector<ColumnSpec>>>& specs() {
  static const std::vector<std::pair<std::string, std::vector<ColumnSpec>>> all = {
      {"steps", columns_of(step_fields())},
      {"oom", columns_of(oom_fields())},
      {"eval", columns_of(eval_fields())},
      {"ranks", {{"rank", true}, {"peak_bytes", true}}},
      {"resumes", columns_of(resume_fields())},
      {"rank_sizes", columns_of(rank_size_fields())},
      {"memory_model", columns_of(memory_model_fields())},
      {"time_model", columns_of(time_model_fields())},
      {"checkpoints", columns_of(checkpoint_fields())},
  };
  return all;
}

// Writes `values` as the 1-D dataset `name` (chunked and extendible, as h5py users may append).
template <class T>
void write_column(hdf5::File& file, const std::string& name, const std::vector<T>& values) {
  const auto type = std::is_same_v<T, double> ? hdf5::DType::kFloat64 : hdf5::DType::kInt64;
  auto dataset = file.create_dataset(name, type, {0}, kChunkRows, /*extendible=*/true);
  if (!values.empty())
    dataset.write_rows(0, static_cast<std::int64_t>(values.size()), type, values.data());
}

template <class Row, class Get>
auto column(const std::vector<Row>& rows, Get get) {
  std::vector<std::decay_t<std::invoke_result_t<Get, const Row&>>> out;
  out.reserve(rows.size());
  for (const auto& r : rows)
    out.push_back(get(r));
  return out;
}

template <class Row>
void write_group(hdf5::File& file, const std::string& group, const std::vector<Field<Row>>& fields,
                 const std::vector<Row>& rows) {
  for (const auto& field : fields) {
    std::visit(
        [&](auto member) {
          write_column(file, group + "/" + field.name, column(rows, std::mem_fn(member)));
        },
        field.member);
  }
}

// The rows of one group of a log read back (a log of any schema version: a column it lacks
// reads as zeros).
template <class Row>
std::vector<Row> rows_of(const RunLogData& data, const std::string& group,
                         const std::vector<Field<Row>>& fields) {
  std::vector<Row> rows;
  const auto g = data.groups.find(group);
  if (g == data.groups.end() || g->second.empty()) return rows;
  rows.resize(g->second.front().values.size());
  for (const auto& field : fields) {
    const RunLogData::Column* values = data.column(group, field.name);
    if (!values) continue;
    std::visit(
        [&](auto member) {
          using Value = std::decay_t<decltype(std::declval<Row>().*member)>;
          for (std::size_t i = 0; i < rows.size() && i < values->values.size(); ++i)
            rows[i].*member = static_cast<Value>(values->values[i]);
        },
        field.member);
  }
  return rows;
}

}  // namespace

const std::vector<std::pair<std::string, std::vector<std::string>>>& run_log_schema() {
  static const auto names = [] {
    std::vector<std::pair<std::string, std::vector<std::string>>> out;
    for (const auto& [group, columns] : specs()) {
      std::vector<std::string> list;
      for (const auto& c : columns)
        list.emplace_back(c.name);
      out.emplace_back(group, list);
    }
    return out;
  }();
  return names;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

RunLogWriter RunLogWriter::create(const std::string& path, const RunLogHeader& header) {
  RunLogWriter writer(path);
  writer.set("format", std::string(kRunLogFormat));
  writer.set("schema_version", kRunLogSchemaVersion);
  writer.set("world_size", header.world_size);
  writer.set("global_batch", header.global_batch);
  writer.set("micro_batch_mode", header.micro_batch_mode);
  writer.set("command_line", header.command_line);
  writer.set("started_at", header.started_at);
  for (const auto& [name, value] : header.text)
    writer.set(name, value);
  for (const auto& [name, value] : header.numbers)
    writer.set(name, value);
  writer.hostnames_ = header.hostnames;
  writer.peak_bytes_.assign(header.hostnames.size(), 0);
  writer.write("running", "");
  return writer;
}

RunLogWriter RunLogWriter::append(const std::string& path, std::int64_t resume_step,
                                  const std::vector<std::string>& hostnames,
                                  const std::string& command_line, const ResumeRow& resumed) {
  const RunLogData existing = read_run_log(path);  // checks the format
  RunLogWriter writer(path);
  {
    const auto file = hdf5::File::open(path);
    for (const auto& name : file.attribute_names())
      writer.set(name, file.attribute_value(name));
  }
  writer.set("schema_version", kRunLogSchemaVersion);
  // A failed run's reason no longer describes the log once it runs again.
  writer.attributes_.erase(std::remove_if(writer.attributes_.begin(), writer.attributes_.end(),
                                          [](const auto& a) { return a.first == "error"; }),
                           writer.attributes_.end());
  writer.hostnames_ = existing.hostnames;
  if (const auto* peaks = existing.column("ranks", "peak_bytes")) {
    for (double v : peaks->values)
      writer.peak_bytes_.push_back(static_cast<std::int64_t>(v));
  }
  writer.steps_ = rows_of(existing, "steps", step_fields());
  writer.ooms_ = rows_of(existing, "oom", oom_fields());
  writer.evals_ = rows_of(existing, "eval", eval_fields());
  writer.checkpoints_ = rows_of(existing, "checkpoints", checkpoint_fields());
  writer.resumes_ = rows_of(existing, "resumes", resume_fields());
  writer.rank_sizes_ = rows_of(existing, "rank_sizes", rank_size_fields());
  writer.memory_models_ = rows_of(existing, "memory_model", memory_model_fields());
  writer.time_models_ = rows_of(existing, "time_model", time_model_fields());
  // The previous run went on past its last checkpoint; this one computes those steps again.
  const auto later = [&](const auto& row) { return row.step >= resume_step; };
  const auto dropped = std::count_if(writer.steps_.begin(), writer.steps_.end(), later);
  writer.steps_.erase(std::remove_if(writer.steps_.begin(), writer.steps_.end(), later),
                      writer.steps_.end());
  writer.ooms_.erase(std::remove_if(writer.ooms_.begin(), writer.ooms_.end(), later),
                     writer.ooms_.end());
  writer.evals_.erase(std::remove_if(writer.evals_.begin(), writer.evals_.end(), later),
                      writer.evals_.end());
  // The checkpoint the run resumes from was written after `resume_step` steps: it stays.
  writer.checkpoints_.erase(std::remove_if(writer.checkpoints_.begin(), writer.checkpoints_.end(),
                                           [&](const auto& row) { return row.step > resume_step; }),
                            writer.checkpoints_.end());
  writer.rank_sizes_.erase(
      std::remove_if(writer.rank_sizes_.begin(), writer.rank_sizes_.end(), later),
      writer.rank_sizes_.end());
  if (!hostnames.empty() && hostnames.size() != writer.hostnames_.size()) {
    writer.hostnames_ = hostnames;
    writer.peak_bytes_.assign(hostnames.size(), 0);
    writer.set("world_size", static_cast<std::int64_t>(hostnames.size()));
  }
  // Texts of each resume as root attributes, one entry per row of `resumes` (logs written before
  // an attribute get empty entries for their earlier resumes): the resumed run's own command
  // line beside the first run's `command_line`, the checkpoint it read, the ones it skipped.
  const auto append_entry = [&](const std::string& attribute, const std::string& entry) {
    std::vector<std::string> entries;
    for (const auto& [name, value] : writer.attributes_) {
      if (name != attribute) continue;
      if (const auto* list = std::get_if<std::vector<std::string>>(&value)) entries = *list;
      if (const auto* one = std::get_if<std::string>(&value)) entries = {*one};
    }
    entries.resize(writer.resumes_.size());
    entries.push_back(entry);
    writer.set(attribute, entries);
  };
  append_entry("resume_command_lines", command_line);
  append_entry("resume_checkpoints", resumed.checkpoint);
  append_entry("resume_skipped", resumed.skipped);
  ResumeRow row = resumed;
  row.step = resume_step;
  row.dropped_steps = static_cast<std::int64_t>(dropped);
  row.world_size = static_cast<std::int64_t>(writer.hostnames_.size());
  row.checkpoint.clear();
  row.skipped.clear();
  writer.resumes_.push_back(row);
  writer.final_micro_batch_ = std::stoll(existing.attribute("final_micro_batch", "0"));
  writer.write("running", "");
  return writer;
}

void RunLogWriter::set(const std::string& name, Attribute value) {
  for (auto& [existing, old] : attributes_) {
    if (existing == name) {
      old = std::move(value);
      return;
    }
  }
  attributes_.emplace_back(name, std::move(value));
}

void RunLogWriter::flush() {
  write("running", "");
}

void RunLogWriter::finish(const std::string& status, const std::string& message) {
  write(status, message);
}

void RunLogWriter::write(const std::string& status, const std::string& message) {
  set("final_micro_batch", final_micro_batch_);
  set("status", status);
  set("updated_at", utc_now());
  if (!message.empty()) set("error", message);
  write_atomically(path_, [&](const std::string& temporary) {
    auto file = hdf5::File::create_in_memory(temporary);
    write_group(file, "steps", step_fields(), steps_);
    write_group(file, "oom", oom_fields(), ooms_);
    write_group(file, "eval", eval_fields(), evals_);
    write_group(file, "checkpoints", checkpoint_fields(), checkpoints_);
    write_group(file, "resumes", resume_fields(), resumes_);
    write_group(file, "rank_sizes", rank_size_fields(), rank_sizes_);
    write_group(file, "memory_model", memory_model_fields(), memory_models_);
    write_group(file, "time_model", time_model_fields(), time_models_);
    // A rank's node-local rank is its place among the ranks on its host, as MPI's
    // MPI_COMM_TYPE_SHARED split numbers them (by world rank).
    std::vector<std::int64_t> ranks, local_ranks;
    std::map<std::string, std::int64_t> on_host;
    for (std::size_t r = 0; r < hostnames_.size(); ++r) {
      ranks.push_back(static_cast<std::int64_t>(r));
      local_ranks.push_back(on_host[hostnames_[r]]++);
    }
    std::vector<std::int64_t> peaks = peak_bytes_;
    peaks.resize(hostnames_.size(), 0);
    write_column(file, "ranks/rank", ranks);
    write_column(file, "ranks/local_rank", local_ranks);
    write_column(file, "ranks/peak_bytes", peaks);
    file.write_strings("ranks/hostname", hostnames_);
    for (const auto& [name, value] : attributes_)
      file.write_attribute(name, value);
    file.write_attribute("nodes", static_cast<std::int64_t>(on_host.size()));
    const std::vector<char> image = file.close_to_image();
    write_file(temporary, image.data(), image.size());
  });
}

const RunLogData::Column* RunLogData::column(const std::string& group,
                                             const std::string& name) const {
  const auto g = groups.find(group);
  if (g == groups.end()) return nullptr;
  for (const auto& c : g->second) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string RunLogData::attribute(const std::string& name, const std::string& fallback) const {
  const auto it = attributes.find(name);
  return it == attributes.end() ? fallback : it->second;
}

std::vector<std::string> RunLogData::attribute_list(const std::string& name) const {
  const auto it = string_lists.find(name);
  return it == string_lists.end() ? std::vector<std::string>{} : it->second;
}

RunLogData read_run_log(const std::string& path) {
  auto file = hdf5::File::open(path);
  if (!file.has_attribute("format") || file.read_string_attribute("format") != kRunLogFormat) {
    throw InputError("'" + path + "' is not an autoaccum run log (no format = \"" +
                     std::string(kRunLogFormat) + "\" attribute)");
  }
  RunLogData data;
  data.path = path;
  for (const auto& name : file.attribute_names()) {
    data.attributes[name] = file.describe_attribute(name);
    hdf5::AttributeValue value;
    try {
      value = file.attribute_value(name);
    } catch (const hdf5::Hdf5Error&) {
      continue;  // another kind (an array of numbers): its text above is all there is
    }
    if (const auto* list = std::get_if<std::vector<std::string>>(&value))
      data.string_lists[name] = *list;
    else if (const auto* one = std::get_if<std::string>(&value))
      data.string_lists[name] = {*one};
  }
  for (const auto& [group, columns] : specs()) {
    auto& out = data.groups[group];
    for (const auto& c : columns) {
      const std::string name = group + "/" + c.name;
      if (!file.has_dataset(name)) continue;  // tolerate logs from later schema versions
      auto dataset = file.dataset(name);
      RunLogData::Column column{c.name, c.integer, {}};
      column.values.resize(static_cast<std::size_t>(dataset.shape().at(0)));
      dataset.read_rows(0, static_cast<std::int64_t>(column.values.size()), hdf5::DType::kFloat64,
                        column.values.data());
      out.push_back(std::move(column));
    }
    // A job killed during a flush can leave that flush's columns of unequal length: the rows
    // every column has are the complete ones.
    std::size_t complete = SIZE_MAX;
    for (const auto& column : out)
      complete = std::min(complete, column.values.size());
    for (auto& column : out)
      column.values.resize(std::min(column.values.size(), complete));
  }
  if (file.has_dataset("ranks/hostname")) data.hostnames = file.read_strings("ranks/hostname");
  return data;
}

}  // namespace autoaccum::io
