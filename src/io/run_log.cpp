// RunLogWriter / read_run_log: extendible chunked datasets, appended at each flush.
#include "autoaccum/io/run_log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
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
      {"retry_seconds", &StepRow::retry_seconds}};
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
  };
  return all;
}

// Appends `values` to the 1-D dataset `name`.
template <class T>
void append_rows(hdf5::File& file, const std::string& name, const std::vector<T>& values) {
  if (values.empty()) return;
  auto dataset = file.dataset(name);
  const std::int64_t length = dataset.shape().at(0);
  const auto type = std::is_same_v<T, double> ? hdf5::DType::kFloat64 : hdf5::DType::kInt64;
  dataset.write_rows(length, static_cast<std::int64_t>(values.size()), type, values.data());
}

template <class Row, class Get>
auto column(const std::vector<Row>& rows, Get get) {
  std::vector<std::decay_t<std::invoke_result_t<Get, const Row&>>> out;
  out.reserve(rows.size());
  for (const auto& r : rows)
    out.push_back(get(r));
  return out;
}

// Appends every buffered row of one group, column by column. A column missing from the file (a
// log written by an older autoaccum, being continued) is left out.
template <class Row>
void append_group(hdf5::File& file, const std::string& group, const std::vector<Field<Row>>& fields,
                  const std::vector<Row>& rows) {
  for (const auto& field : fields) {
    const std::string name = group + "/" + field.name;
    if (!file.has_dataset(name)) continue;
    std::visit([&](auto member) { append_rows(file, name, column(rows, std::mem_fn(member))); },
               field.member);
  }
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
  write_atomically(path, [&](const std::string& temporary) {
    auto file = hdf5::File::create(temporary);
    for (const auto& [group, columns] : specs()) {
      for (const auto& c : columns) {
        file.create_dataset(group + "/" + c.name,
                            c.integer ? hdf5::DType::kInt64 : hdf5::DType::kFloat64, {0},
                            kChunkRows, /*extendible=*/true);
      }
    }
    file.write_strings("ranks/hostname", header.hostnames);
    std::vector<std::int64_t> ranks, zeros;
    for (std::size_t r = 0; r < header.hostnames.size(); ++r) {
      ranks.push_back(static_cast<std::int64_t>(r));
      zeros.push_back(0);
    }
    append_rows(file, "ranks/rank", ranks);
    append_rows(file, "ranks/peak_bytes", zeros);
    file.write_attribute("format", std::string(kRunLogFormat));
    file.write_attribute("schema_version", kRunLogSchemaVersion);
    file.write_attribute("world_size", header.world_size);
    file.write_attribute("global_batch", header.global_batch);
    file.write_attribute("micro_batch_mode", header.micro_batch_mode);
    file.write_attribute("command_line", header.command_line);
    file.write_attribute("started_at", header.started_at);
    file.write_attribute("status", std::string("running"));
    file.write_attribute("final_micro_batch", std::int64_t{0});
    for (const auto& [name, value] : header.text)
      file.write_attribute(name, value);
    for (const auto& [name, value] : header.numbers)
      file.write_attribute(name, value);
  });
  return RunLogWriter(path);
}

RunLogWriter RunLogWriter::append(const std::string& path) {
  RunLogData existing = read_run_log(path);
  RunLogWriter writer(path);
  writer.final_micro_batch_ = std::stoll(existing.attribute("final_micro_batch", "0"));
  writer.write("running", "");
  return writer;
}

void RunLogWriter::flush() {
  write("running", "");
}

void RunLogWriter::finish(const std::string& status, const std::string& message) {
  write(status, message);
}

void RunLogWriter::write(const std::string& status, const std::string& message) {
  // Without a lock: readers may hold the file open while the job runs, and the job must not
  // fail for it. Rows stay buffered until a write succeeds.
  auto file = hdf5::File::open(path_, /*writable=*/true, /*lock=*/false);
  append_group(file, "steps", step_fields(), steps_);
  append_group(file, "oom", oom_fields(), ooms_);
  append_group(file, "eval", eval_fields(), evals_);
  if (!peak_bytes_.empty()) {
    auto peaks = file.dataset("ranks/peak_bytes");
    const auto n =
        std::min<std::int64_t>(peaks.shape().at(0), static_cast<std::int64_t>(peak_bytes_.size()));
    peaks.write_rows(0, n, hdf5::DType::kInt64, peak_bytes_.data());
  }
  file.write_attribute("final_micro_batch", final_micro_batch_);
  file.write_attribute("status", status);
  file.write_attribute("updated_at", utc_now());
  if (!message.empty()) file.write_attribute("error", message);
  file.close();
  steps_.clear();
  ooms_.clear();
  evals_.clear();
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

RunLogData read_run_log(const std::string& path) {
  auto file = hdf5::File::open(path);
  if (!file.has_attribute("format") || file.read_string_attribute("format") != kRunLogFormat) {
    throw InputError("'" + path + "' is not an autoaccum run log (no format = \"" +
                     std::string(kRunLogFormat) + "\" attribute)");
  }
  RunLogData data;
  data.path = path;
  for (const auto& name : file.attribute_names())
    data.attributes[name] = file.describe_attribute(name);
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
