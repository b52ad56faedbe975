// import, synth and inspect: the data subcommands. Rank 0 does the file work; every rank agrees.
#include <chrono>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "autoaccum/comm/agreement.hpp"
#include "autoaccum/core/checksum.hpp"
#include "autoaccum/core/error.hpp"
#include "autoaccum/data/importers.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/hdf5/checksums.hpp"
#include "autoaccum/hdf5/hdf5.hpp"
#include "autoaccum/io/checkpoint.hpp"
#include "commands.hpp"

namespace po = boost::program_options;

namespace autoaccum::cli {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

namespace {

// Runs `work` on rank 0 only (two ranks writing one file would race); all ranks agree on errors.
int on_root(comm::Communicator& world, const std::function<void()>& work) {
  comm::collectively(world, [&] {
    if (world.rank() == 0) work();
  });
  return 0;
}

// `inspect` of a checkpoint: reads it whole as --resume would, verifying every dataset.
void inspect_checkpoint(const std::string& path) {
  const io::Checkpoint c = io::read_checkpoint(path);  // CheckpointDamaged names the dataset
  std::int64_t values = 0;
  for (const auto& [name, tensor] : c.params)
    values += tensor.numel();
  std::cout << path << "\n  autoaccum checkpoint after step " << c.step << " (epoch " << c.epoch
            << "), written by " << c.world_size << " rank(s), micro-batch " << c.micro_batch
            << "\n  " << c.params.size() << " parameter tensors (" << values << " values), "
            << c.buffers.size() << " buffers, optimizer state " << c.optimizer.size() << " bytes\n";
  if (c.verified)
    std::cout << "  verified: " << c.verified_datasets
              << " datasets and the attributes match their checksums" << std::endl;
  else
    std::cout << "  not verified: written before autoaccum stored checksums" << std::endl;
}

// `inspect` of a data file: every dataset that carries a checksum is read whole and compared;
// a progress line every quarter on files over 256 MiB.
void verify_data_checksums(const hdf5::File& file, const std::string& path) {
  std::vector<std::pair<hdf5::Dataset, std::int64_t>> checked;  // and its bytes
  std::int64_t total = 0;
  for (const auto& name : file.dataset_names()) {
    hdf5::Dataset dataset = file.dataset(name);
    if (!dataset.string_attribute(kChecksumAttribute)) continue;
    std::int64_t bytes = hdf5::element_bytes(dataset.dtype());
    for (const auto dim : dataset.shape())
      bytes *= dim;
    total += bytes;
    checked.emplace_back(std::move(dataset), bytes);
  }
  if (checked.empty()) {
    std::cout << "  checksums: none stored (written before autoaccum stored them, or by another "
                 "tool): not verified"
              << std::endl;
    return;
  }
  const bool report = total > (std::int64_t{256} << 20);
  std::int64_t before = 0;
  int quarters = 0;
  std::string names;
  for (const auto& [dataset, bytes] : checked) {
    const auto progress = [&](std::int64_t done) {
      if (!report) return;
      const auto reached = static_cast<int>(4 * (before + done) / total);
      if (reached > quarters && reached < 4) {
        quarters = reached;
        std::cout << "  verifying checksums: " << 25 * reached << "% of " << std::setprecision(3)
                  << static_cast<double>(total) / (1 << 30) << " GiB" << std::endl;
      }
    };
    const auto actual = hdf5::data_checksum(dataset, progress);
    const hdf5::Verdict verdict =
        actual ? hdf5::verify_checksum(dataset, *actual) : hdf5::Verdict::kUnknownAlgorithm;
    if (verdict == hdf5::Verdict::kDamaged)
      throw InputError("'" + path + "' is damaged: dataset '" + dataset.name() +
                       "' does not match its checksum");
    if (verdict != hdf5::Verdict::kVerified)
      throw InputError("'" + path + "': dataset '" + dataset.name() +
                       "' has a checksum this autoaccum cannot check");
    before += bytes;
    names += (names.empty() ? "" : ", ") + dataset.name();
  }
  std::cout << "  checksums: verified (" << names << ")" << std::endl;
}

// Every dataset (type, shape, layout) and attribute of a file.
void print_datasets_and_attributes(const hdf5::File& file, const std::string& path) {
  std::cout << path << "\n  datasets:\n";
  for (const auto& name : file.dataset_names()) {
    const auto dataset = file.dataset(name);
    std::ostringstream shape;
    const auto dims = dataset.shape();
    shape << "[";
    for (std::size_t i = 0; i < dims.size(); ++i)
      shape << (i ? ", " : "") << dims[i];
    shape << "]";
    const auto chunk = dataset.chunk_rows();
    std::cout << "    " << name << "  " << dataset.dtype_name() << "  " << shape.str() << "  "
              << (chunk ? "chunked by " + std::to_string(chunk) + " rows"
                        : std::string("contiguous"))
              << (dataset.filtered() ? ", compressed (slower slab reads)" : "") << "\n";
  }
  std::cout << "  attributes:\n";
  for (const auto& name : file.attribute_names()) {
    std::cout << "    " << name << " = " << file.describe_attribute(name) << "\n";
  }
  std::cout.flush();
}

// What the model will receive from the file, per dataset (docs/data-format.md).
void print_schema(const std::string& path, const std::string& input_list,
                  const std::string& targets) {
  const auto inputs = split_list(input_list);
  data::SlabReader reader({path}, inputs, targets);
  const auto& schema = reader.schema();
  if (schema.documents) {
    std::cout << "  valid document file: " << schema.describe_documents() << "\n";
    std::istringstream fields(schema.describe());
    std::string line;
    std::getline(fields, line);  // the summary, printed above
    while (std::getline(fields, line))
      std::cout << "  " << line << "\n";
    std::cout.flush();
    return;
  }
  std::cout << "  valid training file: " << schema.rows << " rows, inputs " << input_list
            << ", target " << schema.target().name;
  if (schema.num_classes) std::cout << ", " << *schema.num_classes << " classes";
  std::cout << std::endl;
  for (std::size_t i = 0; i + 1 < schema.fields.size(); ++i) {
    const auto& field = schema.fields[i];
    const std::string meaning =
        field.type == data::FieldType::kUInt8 ? "uint8 image, scaled to float32 in [0, 1] (x / 255)"
        : field.type == data::FieldType::kInt64
            ? field.stored_type + " token ids" +
                  (field.stored_type == "uint8" ? " (encoding = integer)" : "") +
                  ", passed unscaled as int64"
            : "float32, passed as stored";
    std::cout << "  input " << field.name << ": " << meaning << std::endl;
  }
  const auto& target = schema.target();
  std::cout << "  target " << target.name << ": "
            << (target.type != data::FieldType::kInt64 ? "float32 values (loss auto: mse)"
                : target.row_shape.empty()
                    ? "int64 class labels per row (loss auto: cross-entropy)"
                    : "int64 token labels per position (loss auto: cross-entropy per token)")
            << std::endl;
}

// import text: byte-level windows, or documents (--documents).
void run_import_text(const po::variables_map& vm) {
  data::TextOptions o;
  o.out_dir = vm["out"].as<std::string>();
  o.context = vm["context"].as<std::int64_t>();
  o.sources = vm.count("files") ? vm["files"].as<std::vector<std::string>>()
                                : std::vector<std::string>{"/usr/share/games/fortunes"};
  if (vm.count("documents")) {
    o.documents = vm["documents"].as<std::string>();
    o.max_length = vm["max-length"].as<std::int64_t>();
    const auto imported = data::import_text_documents(o);
    for (const auto& path : imported.paths) {
      data::SlabReader check({path}, {"tokens"}, "next");
      std::cout << "wrote " << path << ": " << check.schema().describe_documents() << "\n";
    }
    std::cout << "read " << imported.bytes << " bytes (tokens uint8 bytes, offsets int64, "
              << "target the next byte, 256 classes)" << std::endl;
    return;
  }
  if (!vm["max-length"].defaulted())
    throw UsageError("--max-length applies to import text --documents");
  const auto imported = data::import_text(o);
  std::cout << "read " << imported.bytes << " bytes; wrote " << imported.paths[0] << ": "
            << imported.train_rows << " windows of " << o.context << " bytes, " << imported.paths[1]
            << ": " << imported.val_rows << " (x int64 token ids, y the next byte, 256 classes)"
            << std::endl;
}

void run_import_fashion_mnist(const po::variables_map& vm) {
  const std::string source =
      vm.count("source") ? vm["source"].as<std::string>() : "/usr/share/datasets/fashion-mnist";
  for (const auto& path : data::import_fashion_mnist(source, vm["out"].as<std::string>())) {
    data::SlabReader check({path}, {"x"}, "y");
    std::cout << "wrote " << path << ": " << check.schema().rows << " rows, "
              << *check.schema().num_classes << " classes" << std::endl;
  }
}

}  // namespace

Command import_command() {
  Command c;
  c.name = "import";
  c.summary = "Convert a public data set into autoaccum training files (fashion-mnist, text).";
  c.usage =
      "autoaccum import fashion-mnist [--source DIR] --out DIR\n"
      "       autoaccum import text [--context T] --out DIR [FILE|DIR ...]\n"
      "       autoaccum import text --documents fortune|paragraph|file [--max-length L] --out DIR "
      "[FILE|DIR ...]";
  c.options.add_options()("dataset", po::value<std::string>()->required()->value_name("NAME"),
                          "data set to import: fashion-mnist, or text (byte-level LM windows)")(
      "source", po::value<std::string>()->value_name("DIR"),
      "fashion-mnist: folder with the gzip IDX files (default "
      "/usr/share/datasets/fashion-mnist, Debian package dataset-fashion-mnist)")(
      "out", po::value<std::string>()->required()->value_name("DIR"),
      "folder for the files written (created if missing)")(
      "context", po::value<std::int64_t>()->default_value(128)->value_name("T"),
      "text: tokens (bytes) per window")(
      "documents", po::value<std::string>()->value_name("fortune|paragraph|file"),
      "text: write documents of every length (tokens + offsets) instead of windows, one per "
      "%-separated fortune, blank-line-separated paragraph, or file")(
      "max-length", po::value<std::int64_t>()->default_value(0)->value_name("L"),
      "text --documents: split longer documents into pieces of at most L tokens (0: keep)")(
      "files", po::value<std::vector<std::string>>()->value_name("FILE|DIR"),
      "text: files or folders to read (default /usr/share/games/fortunes, Debian package "
      "fortunes)");
  c.positional.add("dataset", 1).add("files", -1);
  c.run = [](const po::variables_map& vm, comm::Communicator& world) {
    return on_root(world, [&] {
      const std::string dataset = vm["dataset"].as<std::string>();
      if (dataset == "text") return run_import_text(vm);
      if (dataset != "fashion-mnist") {
        throw UsageError("import: unknown data set '" + dataset + "' (known: fashion-mnist, text)");
      }
      run_import_fashion_mnist(vm);
    });
  };
  return c;
}

Command synth_command() {
  Command c;
  c.name = "synth";
  c.summary = "Write a learnable synthetic classification set, deterministic from the seed.";
  c.usage = "autoaccum synth --out FILE --rows N --features F --classes C [--seed S]";
  c.options.add_options()("out", po::value<std::string>()->required()->value_name("FILE"),
                          "HDF5 file to write (written to a temporary name, then renamed)")(
      "rows", po::value<std::int64_t>()->required()->value_name("N"), "number of rows")(
      "features", po::value<std::int64_t>()->required()->value_name("F"),
      "features per row (x is float32 [N, F])")(
      "classes", po::value<std::int64_t>()->required()->value_name("C"),
      "number of classes (y is int64 [N])")(
      "seed", po::value<std::uint64_t>()->default_value(0)->value_name("S"), "random seed")(
      "noise", po::value<double>()->default_value(1.0, "1.0")->value_name("SIGMA"),
      "standard deviation of the noise around each class centre");
  c.run = [](const po::variables_map& vm, comm::Communicator& world) {
    return on_root(world, [&] {
      data::SynthOptions o;
      o.out = vm["out"].as<std::string>();
      o.rows = vm["rows"].as<std::int64_t>();
      o.features = vm["features"].as<std::int64_t>();
      o.classes = vm["classes"].as<std::int64_t>();
      o.seed = vm["seed"].as<std::uint64_t>();
      o.noise = vm["noise"].as<double>();
      if (o.noise < 0) throw UsageError("synth: --noise must not be negative");
      data::write_synthetic(o);
      std::cout << "wrote " << o.out << ": " << o.rows << " rows x " << o.features << " features, "
                << o.classes << " classes, seed " << o.seed << std::endl;
    });
  };
  return c;
}

Command inspect_command() {
  Command c;
  c.name = "inspect";
  c.summary =
      "Validate a training file (datasets, shapes, types, attributes, checksums), or verify a "
      "checkpoint.";
  c.usage = "autoaccum inspect FILE|CHECKPOINT [--inputs x] [--targets y]";
  c.options.add_options()("file", po::value<std::string>()->required()->value_name("FILE"),
                          "HDF5 training file")(
      "inputs", po::value<std::string>()->default_value("x")->value_name("A[,B]"),
      "input dataset(s)")("targets", po::value<std::string>()->default_value("y")->value_name("Y"),
                          "target dataset");
  c.positional.add("file", 1);
  c.run = [](const po::variables_map& vm, comm::Communicator& world) {
    return on_root(world, [&] {
      const std::string path = vm["file"].as<std::string>();
      auto file = hdf5::File::open(path);
      if (file.has_attribute("format") &&
          file.read_string_attribute("format") == "autoaccum.checkpoint") {
        inspect_checkpoint(path);
        return;
      }
      print_datasets_and_attributes(file, path);
      verify_data_checksums(file, path);
      print_schema(path, vm["inputs"].as<std::string>(), vm["targets"].as<std::string>());
    });
  };
  return c;
}

}  // namespace autoaccum::cli
