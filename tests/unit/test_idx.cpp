// read_idx: magic numbers, sizes and truncation are checked, with the file named.
#include <gtest/gtest.h>
#include <zlib.h>

#include "autoaccum/core/error.hpp"
#include "autoaccum/data/importers.hpp"

namespace autoaccum::data {
namespace {

std::string write_gz(const std::string& name, const std::vector<unsigned char>& bytes) {
  const std::string path = testing::TempDir() + "/" + name;
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
  return path;
}

std::string error_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Idx, DecodesHeaderAndData) {
  const auto path = write_gz("ok.gz", {0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 6});
  const IdxArray a = read_idx(path);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.values, (std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6}));
}

TEST(Idx, BadMagic) {
  const auto path = write_gz("magic.gz", {0, 0, 9, 1, 0, 0, 0, 1, 7});
  const auto message = error_of(path);
  EXPECT_NE(message.find("magic.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("not an IDX file"), std::string::npos) << message;
}

TEST(Idx, TruncatedData) {
  const auto message = error_of(write_gz("short.gz", {0, 0, 8, 1, 0, 0, 0, 5, 1, 2}));
  EXPECT_NE(message.find("truncated data"), std::string::npos) << message;
}

TEST(Idx, TrailingData) {
  const auto message = error_of(write_gz("long.gz", {0, 0, 8, 1, 0, 0, 0, 1, 1, 2}));
  EXPECT_NE(message.find("more data than its header"), std::string::npos) << message;
}

TEST(Idx, MissingFile) {
  EXPECT_NE(error_of("/nonexistent/idx.gz").find("/nonexistent/idx.gz"), std::string::npos);
}

}  // namespace
}  // namespace autoaccum::data
