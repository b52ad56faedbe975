// Importers: Fashion-MNIST's IDX files (gzip through zlib), text as byte windows or as documents,
// and a seeded synthetic classification set; every dataset written with its checksum.
#include "autoaccum/data/importers.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "autoaccum/core/atomic_write.hpp"
#include "autoaccum/core/checksum.hpp"
#include "autoaccum/core/distinct_paths.hpp"
#include "autoaccum/core/splitmix.hpp"
#include "autoaccum/hdf5/checksums.hpp"
#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::data {
namespace {

// Reads exactly `bytes` or fails naming the file.
void read_exactly(gzFile file, const std::string& path, void* out, std::size_t bytes,
                  const char* what) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const unsigned piece = static_cast<unsigned>(std::min<std::size_t>(bytes, 1u << 30));
    const int got = gzread(file, p, piece);
    if (got <= 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      throw InputError("'" + path + "': truncated " + what +
                       (code != Z_OK && code != Z_STREAM_END ? std::string(" (") + message + ")"
                                                             : std::string()));
    }
    p += got;
    bytes -= static_cast<std::size_t>(got);
  }
}

std::uint32_t big_endian(const unsigned char bytes[4]) {
  return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
         (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
}

void ensure_directory(const std::string& dir) {
  struct stat info {};
  if (stat(dir.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) throw InputError("--out: '" + dir + "' is not a directory");
    return;
  }
  if (mkdir(dir.c_str(), 0755) != 0) {
    throw InputError("--out: cannot create directory '" + dir + "': " + std::strerror(errno));
  }
}

const std::vector<std::string> kFashionClasses = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                  "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                  "Bag",         "Ankle boot"};

// SplitMix64 stream plus Box-Muller: portable and reproducible from the seed.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix64(state_); }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  double normal() {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return r * std::cos(6.283185307179586 * uniform());
  }
  std::int64_t below(std::int64_t bound) {
    return static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(bound));
  }

 private:
  std::uint64_t state_;
};

}  // namespace

IdxArray read_idx(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw InputError("cannot open '" + path + "': " + std::strerror(errno));
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{file};
  unsigned char magic[4];
  read_exactly(file, path, magic, 4, "header");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] < 1 || magic[3] > 4) {
    throw InputError("'" + path + "' is not an IDX file of unsigned bytes (magic number " +
                     std::to_string(big_endian(magic)) + ")");
  }
  IdxArray array;
  std::size_t count = 1;
  for (int d = 0; d < magic[3]; ++d) {
    unsigned char size[4];
    read_exactly(file, path, size, 4, "header");
    array.shape.push_back(big_endian(size));
    count *= big_endian(size);
  }
  array.values.resize(count);
  read_exactly(file, path, array.values.data(), count, "data");
  unsigned char extra = 0;
  if (gzread(file, &extra, 1) > 0) {
    throw InputError("'" + path + "' has more data than its header says (" + std::to_string(count) +
                     " bytes)");
  }
  return array;
}

std::vector<std::string> import_fashion_mnist(const std::string& source_dir,
                                              const std::string& out_dir) {
  struct Split {
    const char* prefix;
    const char* out;
  };
  const Split splits[] = {Split{"train", "fashion-mnist-train.h5"},
                          Split{"t10k", "fashion-mnist-test.h5"}};
  {
    std::vector<core::NamedPath> inputs, outputs;
    for (const Split split : splits) {
      for (const char* kind : {"-images-idx3-ubyte.gz", "-labels-idx1-ubyte.gz"})
        inputs.push_back({"--source", source_dir + "/" + split.prefix + kind});
      outputs.push_back({"--out", out_dir + "/" + split.out});
    }
    core::check_outputs_apart(inputs, outputs);
  }
  ensure_directory(out_dir);
  std::vector<std::string> written;
  for (const Split split : splits) {
    const std::string images_path = source_dir + "/" + split.prefix + "-images-idx3-ubyte.gz";
    const std::string labels_path = source_dir + "/" + split.prefix + "-labels-idx1-ubyte.gz";
    const IdxArray images = read_idx(images_path);
    const IdxArray labels = read_idx(labels_path);
    if (images.shape.size() != 3 || labels.shape.size() != 1) {
      throw InputError("'" + images_path + "' must be 3-D images and '" + labels_path +
                       "' 1-D labels");
    }
    if (images.shape[0] != labels.shape[0]) {
      throw InputError("'" + images_path + "' has " + std::to_string(images.shape[0]) +
                       " images but '" + labels_path + "' has " + std::to_string(labels.shape[0]) +
                       " labels");
    }
    std::vector<std::int64_t> y(labels.values.begin(), labels.values.end());
    for (std::size_t i = 0; i < y.size(); ++i) {
      if (y[i] >= static_cast<std::int64_t>(kFashionClasses.size())) {
        throw InputError("'" + labels_path + "': label " + std::to_string(y[i]) + " at row " +
                         std::to_string(i) + " is not a Fashion-MNIST class (0-9)");
      }
    }
    const std::string out = out_dir + "/" + split.out;
    write_atomically(out, [&](const std::string& temporary) {
      auto file = hdf5::File::create(temporary);
      const std::int64_t n = images.shape[0];
      hdf5::write_with_checksum(file, "x", hdf5::DType::kUInt8,
                                {n, 1, images.shape[1], images.shape[2]}, images.values.data());
      hdf5::write_with_checksum(file, "y", hdf5::DType::kInt64, {n}, y.data());
      file.write_attribute("num_classes", std::int64_t{10});
      file.write_attribute("class_names", kFashionClasses);
      file.write_attribute("source", images_path);
    });
    written.push_back(out);
  }
  return written;
}

namespace {

bool skipped_text_file(const std::string& name) {
  const auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name.empty() || name[0] == '.' || ends(".dat") || ends(".u8");
}

std::vector<std::string> text_files(const std::vector<std::string>& sources) {
  std::vector<std::string> files;
  for (const auto& source : sources) {
    struct stat info {};
    if (stat(source.c_str(), &info) != 0)
      throw InputError("import text: '" + source + "' does not exist");
    if (!S_ISDIR(info.st_mode)) {
      files.push_back(source);
      continue;
    }
    std::vector<std::string> inside;
    if (DIR* listing = opendir(source.c_str())) {
      while (const dirent* entry = readdir(listing)) {
        const std::string name = entry->d_name;
        const std::string path = source + "/" + name;
        struct stat item {};
        // lstat: links (fortunes' .u8 files point at the plain ones) would count a file twice.
        if (skipped_text_file(name) || lstat(path.c_str(), &item) != 0 || !S_ISREG(item.st_mode))
          continue;
        inside.push_back(path);
      }
      closedir(listing);
    }
    std::sort(inside.begin(), inside.end());
    if (inside.empty()) throw InputError("import text: folder '" + source + "' has no text files");
    files.insert(files.end(), inside.begin(), inside.end());
  }
  return files;
}

void write_windows(const std::string& path, const std::vector<std::uint8_t>& bytes,
                   std::int64_t first_window, std::int64_t windows, std::int64_t context,
                   const std::string& source) {
  // Inputs as bytes (token ids, encoding = integer: 8x smaller than int64); labels as int64,
  // the type of class labels.
  std::vector<std::uint8_t> x(static_cast<std::size_t>(windows * context));
  std::vector<std::int64_t> y(x.size());
  for (std::int64_t w = 0; w < windows; ++w) {
    const std::int64_t start = (first_window + w) * context;
    for (std::int64_t t = 0; t < context; ++t) {
      x[static_cast<std::size_t>(w * context + t)] = bytes[static_cast<std::size_t>(start + t)];
      y[static_cast<std::size_t>(w * context + t)] = bytes[static_cast<std::size_t>(start + t + 1)];
    }
  }
  write_atomically(path, [&](const std::string& temporary) {
    auto file = hdf5::File::create(temporary);
    {
      auto inputs =
          hdf5::write_with_checksum(file, "x", hdf5::DType::kUInt8, {windows, context}, x.data());
      inputs.write_attribute("encoding", std::string("integer"));
    }
    hdf5::write_with_checksum(file, "y", hdf5::DType::kInt64, {windows, context}, y.data());
    file.write_attribute("num_classes", std::int64_t{256});
    file.write_attribute("tokens", std::string("bytes"));
    file.write_attribute("source", source);
    file.close();
  });
}

}  // namespace

namespace {

// The two files an import of `files` writes into `out_dir`, checked apart from the sources
// (before anything is written), with the folder made.
std::vector<std::string> text_outputs(const std::vector<std::string>& files,
                                      const std::string& out_dir, const std::string& train,
                                      const std::string& validation) {
  const std::vector<std::string> outputs = {out_dir + "/" + train, out_dir + "/" + validation};
  std::vector<core::NamedPath> inputs;
  for (const auto& path : files)
    inputs.push_back({"import text source", path});
  core::check_outputs_apart(inputs, {{"--out", outputs[0]}, {"--out", outputs[1]}});
  ensure_directory(out_dir);
  return outputs;
}

// The `source` attribute: "a.txt", or "a.txt (+3 files)".
std::string source_text(const std::vector<std::string>& files) {
  return files.size() == 1 ? files.front()
                           : files.front() + " (+" + std::to_string(files.size() - 1) + " files)";
}

}  // namespace

TextImport import_text(const TextOptions& o) {
  if (o.context < 1) throw UsageError("--context must be at least 1");
  if (!(o.validation_fraction > 0 && o.validation_fraction < 1))
    throw UsageError("the validation fraction must lie in (0, 1)");
  std::vector<std::uint8_t> bytes;
  const auto files = text_files(o.sources);
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError("import text: cannot read '" + path + "'");
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto total = static_cast<std::int64_t>(bytes.size());
  const std::int64_t windows = total > 0 ? (total - 1) / o.context : 0;
  if (windows < 2) {
    throw InputError("import text: " + std::to_string(total) + " bytes in " +
                     std::to_string(files.size()) + " file(s) make fewer than two windows of " +
                     std::to_string(o.context) + " tokens (--context)");
  }
  const std::int64_t val = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(static_cast<double>(windows) * o.validation_fraction));
  const std::vector<std::string> outputs =
      text_outputs(files, o.out_dir, "text-train.h5", "text-val.h5");
  TextImport result;
  result.bytes = total;
  result.train_rows = windows - val;
  result.val_rows = val;
  const std::string source = source_text(files);
  result.paths = outputs;
  write_windows(result.paths[0], bytes, 0, result.train_rows, o.context, source);
  write_windows(result.paths[1], bytes, result.train_rows, val, o.context, source);
  return result;
}

namespace {

// The documents of one file's text under `split`.
std::vector<std::string> split_documents(const std::string& text, const std::string& split) {
  std::vector<std::string> documents;
  if (split == "file") {
    documents.push_back(text);
    return documents;
  }
  std::string current;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    end = end == std::string::npos ? text.size() : end + 1;
    const std::string line = text.substr(begin, end - begin);
    const bool boundary = split == "fortune"
                              ? (line == "%\n" || line == "%")
                              : line.find_first_not_of(" \t\r\n") == std::string::npos;
    if (boundary) {
      documents.push_back(current);
      current.clear();
    } else {
      current += line;
    }
    begin = end;
  }
  documents.push_back(current);
  return documents;
}

void write_documents(const std::string& path, const std::vector<std::string>& documents,
                     const std::string& source, const std::string& split) {
  std::vector<std::uint8_t> tokens;
  std::vector<std::int64_t> offsets{0};
  for (const auto& d : documents) {
    tokens.insert(tokens.end(), d.begin(), d.end());
    offsets.push_back(static_cast<std::int64_t>(tokens.size()));
  }
  write_atomically(path, [&](const std::string& temporary) {
    auto file = hdf5::File::create(temporary);
    {
      auto set =
          hdf5::write_with_checksum(file, "tokens", hdf5::DType::kUInt8,
                                    {static_cast<std::int64_t>(tokens.size())}, tokens.data());
      set.write_attribute("encoding", std::string("integer"));
    }
    hdf5::write_with_checksum(file, "offsets", hdf5::DType::kInt64,
                              {static_cast<std::int64_t>(offsets.size())}, offsets.data());
    file.write_attribute("num_classes", std::int64_t{256});
    file.write_attribute("tokens", std::string("bytes"));
    file.write_attribute("documents", split);
    file.write_attribute("source", source);
    file.close();
  });
}

}  // namespace

TextImport import_text_documents(const TextOptions& o) {
  if (o.documents != "file" && o.documents != "fortune" && o.documents != "paragraph")
    throw UsageError("--documents: '" + o.documents + "' is not one of file, fortune, paragraph");
  if (o.max_length < 0) throw UsageError("--max-length must not be negative");
  if (!(o.validation_fraction > 0 && o.validation_fraction < 1))
    throw UsageError("the validation fraction must lie in (0, 1)");
  const auto files = text_files(o.sources);
  std::vector<std::string> documents;
  TextImport result;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError("import text: cannot read '" + path + "'");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    result.bytes += static_cast<std::int64_t>(text.size());
    for (const auto& d : split_documents(text, o.documents)) {
      if (d.find_first_not_of(" \t\r\n") == std::string::npos) continue;
      const std::size_t piece =
          o.max_length > 0 ? static_cast<std::size_t>(o.max_length) : d.size();
      for (std::size_t at = 0; at < d.size(); at += piece)
        documents.push_back(d.substr(at, piece));
    }
  }
  if (documents.size() < 2) {
    throw InputError("import text --documents " + o.documents + ": " +
                     std::to_string(documents.size()) + " document(s) in " +
                     std::to_string(files.size()) + " file(s); at least two are needed");
  }
  const auto count = static_cast<std::int64_t>(documents.size());
  const std::int64_t val = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(static_cast<double>(count) * o.validation_fraction));
  const std::vector<std::string> outputs =
      text_outputs(files, o.out_dir, "text-docs-train.h5", "text-docs-val.h5");
  const std::string source = source_text(files);
  result.paths = outputs;
  result.train_rows = count - val;
  result.val_rows = val;
  const auto split_at = documents.begin() + (count - val);
  write_documents(outputs[0], std::vector<std::string>(documents.begin(), split_at), source,
                  o.documents);
  write_documents(outputs[1], std::vector<std::string>(split_at, documents.end()), source,
                  o.documents);
  return result;
}

void write_synthetic(const SynthOptions& o) {
  if (o.rows < 1) throw UsageError("synth: --rows must be at least 1");
  if (o.features < 1) throw UsageError("synth: --features must be at least 1");
  if (o.classes < 2) throw UsageError("synth: --classes must be at least 2");
  if (o.rows_per_write < 1) throw UsageError("synth: rows per write must be at least 1");
  Random centres_random(o.seed);
  std::vector<float> centres(static_cast<std::size_t>(o.classes * o.features));
  for (auto& c : centres)
    c = static_cast<float>(2.0 * centres_random.normal());
  write_atomically(o.out, [&](const std::string& temporary) {
    auto file = hdf5::File::create(temporary);
    // Contiguous layout: the size is known, and slab reads of a contiguous dataset are one
    // sequential read.
    auto x = file.create_dataset("x", hdf5::DType::kFloat32, {o.rows, o.features});
    auto y = file.create_dataset("y", hdf5::DType::kInt64, {o.rows});
    // Each piece has its own stream, so the content does not depend on rows_per_write.
    std::vector<float> xs;
    std::vector<std::int64_t> ys;
    Checksum x_sum, y_sum;
    for (std::int64_t first = 0; first < o.rows; first += o.rows_per_write) {
      const std::int64_t count = std::min(o.rows_per_write, o.rows - first);
      xs.resize(static_cast<std::size_t>(count * o.features));
      ys.resize(static_cast<std::size_t>(count));
      for (std::int64_t r = 0; r < count; ++r) {
        Random row_random(o.seed ^
                          (0xD1B54A32D192ED03ULL * static_cast<std::uint64_t>(first + r + 1)));
        const std::int64_t label = row_random.below(o.classes);
        ys[static_cast<std::size_t>(r)] = label;
        for (std::int64_t f = 0; f < o.features; ++f) {
          xs[static_cast<std::size_t>(r * o.features + f)] =
              centres[static_cast<std::size_t>(label * o.features + f)] +
              static_cast<float>(o.noise * row_random.normal());
        }
      }
      x.write_rows(first, count, hdf5::DType::kFloat32, xs.data());
      y.write_rows(first, count, hdf5::DType::kInt64, ys.data());
      x_sum.add(xs.data(), xs.size() * sizeof(float));
      y_sum.add(ys.data(), ys.size() * sizeof(std::int64_t));
    }
    x.write_attribute(kChecksumAttribute, x_sum.text());
    y.write_attribute(kChecksumAttribute, y_sum.text());
    file.write_attribute("num_classes", o.classes);
    file.write_attribute("seed", static_cast<std::int64_t>(o.seed));
    file.write_attribute("generator", std::string("autoaccum synth"));
  });
}

}  // namespace autoaccum::data
