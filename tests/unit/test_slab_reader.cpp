// SlabReader and the HDF5 layer: values round-trip, shards equal one file, bad input is named.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <numeric>

#include "autoaccum/data/batch_plan.hpp"
#include "autoaccum/data/importers.hpp"
#include "autoaccum/data/slab_reader.hpp"
#include "autoaccum/hdf5/hdf5.hpp"

namespace autoaccum::data {
namespace {

class Files : public testing::Test {
 protected:
  std::string dir = testing::TempDir() + "/autoaccum_slab_" + std::to_string(::getpid());
  void SetUp() override { ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0); }
  void TearDown() override { (void)system(("rm -rf " + dir).c_str()); }
  std::string path(const std::string& name) const { return dir + "/" + name; }

  // x uint8 [rows, 2, 3] with x[r] = (r * 6 + k) % 251, y int64 = r % classes.
  std::string write_images(const std::string& name, std::int64_t first_row, std::int64_t rows,
                           std::int64_t classes = 10, bool attribute = true,
                           std::int64_t chunk_rows = 0) {
    std::vector<std::uint8_t> x(static_cast<std::size_t>(rows * 6));
    std::vector<std::int64_t> y(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      for (int k = 0; k < 6; ++k)
        x[static_cast<std::size_t>(r * 6 + k)] =
            static_cast<std::uint8_t>(((first_row + r) * 6 + k) % 251);
      y[static_cast<std::size_t>(r)] = (first_row + r) % classes;
    }
    auto file = hdf5::File::create(path(name));
    file.create_dataset("x", hdf5::DType::kUInt8, {rows, 2, 3})
        .write_rows(0, rows, hdf5::DType::kUInt8, x.data());
    file.create_dataset("y", hdf5::DType::kInt64, {rows})
        .write_rows(0, rows, hdf5::DType::kInt64, y.data());
    if (attribute) file.write_attribute("num_classes", classes);
    return path(name);
  }

  std::string error_of(const std::vector<std::string>& files,
                       std::vector<std::string> inputs = {"x"}, const std::string& target = "y") {
    try {
      SlabReader reader(files, std::move(inputs), target);
    } catch (const InputError& e) {
      return e.what();
    } catch (const Error& e) {
      return std::string("wrong error type: ") + e.what();
    }
    return "no error";
  }
};

TEST_F(Files, ReadsSlabsWithUint8ScaledToUnitRange) {
  const auto file = write_images("a.h5", 0, 50);
  SlabReader reader({file}, {"x"}, "y");
  EXPECT_EQ(reader.schema().rows, 50);
  EXPECT_EQ(reader.schema().num_classes, 10);
  Batch b = reader.read(7, 19);
  ASSERT_EQ(b.rows(), 12);
  EXPECT_EQ(b.first_row, 7);
  const auto x = b.get("x");
  EXPECT_EQ(x.scalar_type(), torch::kFloat32);
  EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{12, 2, 3}));
  for (std::int64_t r = 0; r < 12; ++r) {
    for (int k = 0; k < 6; ++k) {
      const float expected = static_cast<float>(((7 + r) * 6 + k) % 251) / 255.0f;
      ASSERT_EQ(x[r].flatten()[k].item<float>(), expected) << "row " << r;
    }
  }
  EXPECT_TRUE(torch::equal(b.get("y"), torch::arange(7, 19, torch::kInt64) % 10));
}

TEST_F(Files, ThreeShardsGiveTheSameRowsInTheSameOrderAsOneFile) {
  const auto whole = write_images("whole.h5", 0, 120);
  const auto s0 = write_images("s0.h5", 0, 45);
  const auto s1 = write_images("s1.h5", 45, 30);
  const auto s2 = write_images("s2.h5", 75, 45);
  SlabReader one({whole}, {"x"}, "y");
  SlabReader sharded({s0, s1, s2}, {"x"}, "y");
  ASSERT_EQ(sharded.schema().rows, 120);
  // Every batch and rank slab of two shuffled epochs, including slabs that cross shards.
  BatchPlan plan(120, 40, 3, Shuffle::kBatch, 11);
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    for (std::int64_t step = 0; step < plan.batches_per_epoch(); ++step) {
      for (int rank = 0; rank < 3; ++rank) {
        const RowRange rows = plan.rank_rows(epoch, step, rank);
        Batch a = one.read(rows.begin, rows.end);
        Batch b = sharded.read(rows.begin, rows.end);
        EXPECT_TRUE(torch::equal(a.get("x"), b.get("x")));
        EXPECT_TRUE(torch::equal(a.get("y"), b.get("y")));
      }
    }
  }
  Batch across = sharded.read(40, 80);  // crosses s0|s1 and s1|s2
  EXPECT_TRUE(torch::equal(across.get("y"), one.read(40, 80).get("y")));
}

TEST_F(Files, ChunkedDatasetsReadThroughHdf5GiveTheSameRows) {
  // Contiguous datasets are read with pread at their offset; chunked ones through HDF5.
  SlabReader contiguous({write_images("contiguous.h5", 0, 100)}, {"x"}, "y");
  SlabReader chunked({write_images("chunked.h5", 0, 100, 10, true, 7)}, {"x"}, "y");
  for (auto [begin, end] : {std::pair{0, 100}, std::pair{3, 17}, std::pair{95, 100}}) {
    Batch a = contiguous.read(begin, end), b = chunked.read(begin, end);
    EXPECT_TRUE(torch::equal(a.get("x"), b.get("x")));
    EXPECT_TRUE(torch::equal(a.get("y"), b.get("y")));
  }
}

TEST_F(Files, GlobExpandsInNameOrder) {
  write_images("part-1.h5", 0, 5);
  write_images("part-0.h5", 0, 5);
  const auto paths = expand_data_paths({path("part-*.h5")});
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0], path("part-0.h5"));
  EXPECT_EQ(paths[1], path("part-1.h5"));
  EXPECT_THROW(expand_data_paths({path("nothing-*.h5")}), InputError);
}

TEST_F(Files, NotHdf5) {
  std::ofstream(path("text.h5")) << "hello";
  const auto message = error_of({path("text.h5")});
  EXPECT_NE(message.find("text.h5"), std::string::npos) << message;
  EXPECT_NE(message.find("not an HDF5 file"), std::string::npos) << message;
}

TEST_F(Files, Truncated) {
  const auto file = write_images("full.h5", 0, 200);
  ASSERT_EQ(truncate(file.c_str(), 1000), 0);
  const auto message = error_of({file});
  EXPECT_NE(message.find("full.h5"), std::string::npos) << message;
}

TEST_F(Files, MissingFileAndDirectory) {
  EXPECT_NE(error_of({path("absent.h5")}).find("No such file"), std::string::npos);
  EXPECT_NE(error_of({dir}).find("is a directory"), std::string::npos);
}

TEST_F(Files, MissingDatasetNamesItAndTheOption) {
  const auto file = write_images("a.h5", 0, 5);
  const auto message = error_of({file}, {"pixels"});
  EXPECT_NE(message.find("no dataset 'pixels'"), std::string::npos) << message;
  EXPECT_NE(message.find("--inputs"), std::string::npos) << message;
  EXPECT_NE(error_of({file}, {"x"}, "labels").find("--targets"), std::string::npos);
}

TEST_F(Files, EmptyDataset) {
  const auto file = write_images("empty.h5", 0, 0);
  const auto message = error_of({file});
  EXPECT_NE(message.find("no rows"), std::string::npos) << message;
}

TEST_F(Files, LengthsDiffer) {
  auto file = hdf5::File::create(path("mismatch.h5"));
  std::vector<float> x(10 * 4, 0.0f);
  std::vector<std::int64_t> y(9, 0);
  file.create_dataset("x", hdf5::DType::kFloat32, {10, 4})
      .write_rows(0, 10, hdf5::DType::kFloat32, x.data());
  file.create_dataset("y", hdf5::DType::kInt64, {9})
      .write_rows(0, 9, hdf5::DType::kInt64, y.data());
  file = hdf5::File::open(path("mismatch.h5"));  // drop the writer's handle
  const auto message = error_of({path("mismatch.h5")});
  EXPECT_NE(message.find("'x' has 10 rows but 'y' has 9"), std::string::npos) << message;
}

TEST_F(Files, TokenIdsOfInt32OrInt64ReachTheModelAsInt64Unscaled) {
  const std::vector<std::int32_t> x32 = {1, 2, 3, 250, 251, 252, 7, 8, 9, 10, 11, 12};
  const std::vector<std::int64_t> y = {2, 3, -100, 251, 252, 7, 8, 9, -100, 11, 12, 13};
  {
    auto file = hdf5::File::create(path("tokens.h5"));
    file.create_dataset("x", hdf5::DType::kInt32, {4, 3})
        .write_rows(0, 4, hdf5::DType::kInt32, x32.data());
    file.create_dataset("y", hdf5::DType::kInt64, {4, 3})
        .write_rows(0, 4, hdf5::DType::kInt64, y.data());
  }
  SlabReader reader({path("tokens.h5")}, {"x"}, "y");
  EXPECT_EQ(reader.schema().fields[0].type, FieldType::kInt64);
  EXPECT_EQ(reader.schema().max_label, 252) << "-100 (ignored) is not a label";
  EXPECT_EQ(*reader.schema().num_classes, 253);
  const Batch batch = reader.read(1, 4);
  ASSERT_EQ(batch[0].scalar_type(), at::kLong);
  EXPECT_EQ(batch[0].sizes(), (std::vector<std::int64_t>{3, 3}));
  for (std::int64_t i = 0; i < 9; ++i) {
    EXPECT_EQ(batch[0].reshape({-1})[i].item<std::int64_t>(), x32[static_cast<std::size_t>(3 + i)]);
    EXPECT_EQ(batch[1].reshape({-1})[i].item<std::int64_t>(), y[static_cast<std::size_t>(3 + i)]);
  }
}

TEST_F(Files, UnsupportedDtype) {
  {
    auto file = hdf5::File::create(path("double.h5"));
    std::vector<double> x(8, 0.0);
    std::vector<std::int64_t> y(4, 0);
    file.create_dataset("x", hdf5::DType::kFloat64, {4, 2})
        .write_rows(0, 4, hdf5::DType::kFloat64, x.data());
    file.create_dataset("y", hdf5::DType::kInt64, {4})
        .write_rows(0, 4, hdf5::DType::kInt64, y.data());
  }
  const auto message = error_of({path("double.h5")});
  EXPECT_NE(message.find("dataset 'x'"), std::string::npos) << message;
  EXPECT_NE(message.find("unsupported type float64"), std::string::npos) << message;
}

TEST_F(Files, LabelOutOfRange) {
  const auto file = write_images("labels.h5", 0, 30, 12, false);  // labels up to 11 ...
  {
    auto f = hdf5::File::open(file, true);
    f.write_attribute("num_classes", std::int64_t{10});  // ... but 10 classes declared
  }
  const auto message = error_of({file});
  EXPECT_NE(message.find("label 10 at row 10 is outside [0, 10)"), std::string::npos) << message;
  // Without the attribute, classes = max label + 1.
  SlabReader reader({write_images("noattr.h5", 0, 30, 12, false)}, {"x"}, "y");
  EXPECT_EQ(reader.schema().num_classes, 12);
}

TEST_F(Files, NegativeLabel) {
  auto file = hdf5::File::create(path("negative.h5"));
  std::vector<float> x(3, 0.0f);
  std::vector<std::int64_t> y = {0, -1, 1};
  file.create_dataset("x", hdf5::DType::kFloat32, {3, 1})
      .write_rows(0, 3, hdf5::DType::kFloat32, x.data());
  file.create_dataset("y", hdf5::DType::kInt64, {3})
      .write_rows(0, 3, hdf5::DType::kInt64, y.data());
  file = hdf5::File::open(path("negative.h5"));
  EXPECT_NE(error_of({path("negative.h5")}).find("label -1 at row 1"), std::string::npos);
}

TEST_F(Files, ShardsMustAgree) {
  const auto a = write_images("a.h5", 0, 5);
  {
    auto file = hdf5::File::create(path("b.h5"));
    std::vector<std::uint8_t> x(5 * 4, 0);
    std::vector<std::int64_t> y(5, 0);
    file.create_dataset("x", hdf5::DType::kUInt8, {5, 4})
        .write_rows(0, 5, hdf5::DType::kUInt8, x.data());
    file.create_dataset("y", hdf5::DType::kInt64, {5})
        .write_rows(0, 5, hdf5::DType::kInt64, y.data());
  }
  const auto message = error_of({a, path("b.h5")});
  EXPECT_NE(message.find("shards must agree"), std::string::npos) << message;
  EXPECT_NE(message.find("b.h5"), std::string::npos) << message;
  const auto c = write_images("c.h5", 5, 5, 7);
  EXPECT_NE(error_of({a, c}).find("num_classes"), std::string::npos);
}

TEST_F(Files, FloatTargetsAreRegression) {
  auto file = hdf5::File::create(path("reg.h5"));
  std::vector<float> x(6, 1.0f), y = {0.5f, -2.0f, 3.25f};
  file.create_dataset("x", hdf5::DType::kFloat32, {3, 2})
      .write_rows(0, 3, hdf5::DType::kFloat32, x.data());
  file.create_dataset("t", hdf5::DType::kFloat32, {3})
      .write_rows(0, 3, hdf5::DType::kFloat32, y.data());
  file = hdf5::File::open(path("reg.h5"));
  SlabReader reader({path("reg.h5")}, {"x"}, "t");
  EXPECT_FALSE(reader.schema().num_classes.has_value());
  EXPECT_TRUE(torch::equal(reader.read(0, 3).get("t"), torch::tensor({0.5f, -2.0f, 3.25f})));
}

TEST_F(Files, HandlesShareAndReleaseIdentifiers) {
  const auto file = write_images("h.h5", 0, 3);
  auto opened = hdf5::File::open(file);
  hid_t id = -1;
  {
    hdf5::Handle a(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    id = a.id();
    hdf5::Handle b = a;  // shared
    EXPECT_EQ(H5Iget_ref(id), 2);
    hdf5::Handle c = std::move(b);  // moved: the source is nulled, no extra reference
    EXPECT_FALSE(b.valid());        // NOLINT(bugprone-use-after-move): checking the contract
    EXPECT_EQ(H5Iget_ref(id), 2);
  }
  hdf5::ErrorSilencer quiet;
  EXPECT_LT(H5Iget_ref(id), 0) << "the identifier must be closed by its last owner";
}

TEST(Importers, SyntheticIsDeterministicAndIndependentOfWriteSize) {
  const std::string dir = testing::TempDir();
  SynthOptions o;
  o.rows = 1000;
  o.features = 5;
  o.classes = 3;
  o.seed = 8;
  o.out = dir + "/synth_a.h5";
  write_synthetic(o);
  o.out = dir + "/synth_b.h5";
  o.rows_per_write = 7;
  write_synthetic(o);
  o.out = dir + "/synth_c.h5";
  o.seed = 9;
  write_synthetic(o);
  auto read_all = [](const std::string& p) { return SlabReader({p}, {"x"}, "y").read(0, 1000); };
  Batch a = read_all(dir + "/synth_a.h5"), b = read_all(dir + "/synth_b.h5"),
        c = read_all(dir + "/synth_c.h5");
  EXPECT_TRUE(torch::equal(a.get("x"), b.get("x")));
  EXPECT_TRUE(torch::equal(a.get("y"), b.get("y")));
  EXPECT_FALSE(torch::equal(a.get("x"), c.get("x")));
  // Every class appears.
  EXPECT_EQ(std::get<0>(torch::_unique(a.get("y"))).numel(), 3);
}

}  // namespace
}  // namespace autoaccum::data
