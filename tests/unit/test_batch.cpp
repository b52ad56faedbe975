// Batch: slices are views into the slab (same storage, offset pointer), never copies.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "autoaccum/core/error.hpp"
#include "autoaccum/data/batch.hpp"

namespace autoaccum::data {
namespace {

Batch example(std::int64_t rows) {
  Batch b;
  b.add("x", torch::arange(rows * 6, torch::kFloat32).reshape({rows, 2, 3}));
  b.add("y", torch::arange(rows, torch::kInt64));
  b.first_row = 1000;
  return b;
}

TEST(Batch, SliceIsAViewIntoTheSameStorage) {
  Batch batch = example(10);
  Batch micro = batch.slice(4, 3);
  ASSERT_EQ(micro.rows(), 3);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const auto& whole = batch[i];
    const auto& part = micro[i];
    EXPECT_TRUE(part.is_alias_of(whole)) << batch.names()[i];
    const auto row_bytes = whole.stride(0) * whole.element_size();
    EXPECT_EQ(static_cast<const char*>(part.data_ptr()),
              static_cast<const char*>(whole.data_ptr()) + 4 * row_bytes);
  }
  // Writing through the view changes the slab: no copy was made.
  micro.get("y").fill_(-1);
  EXPECT_EQ(batch.get("y")[4].item<std::int64_t>(), -1);
  EXPECT_EQ(batch.get("y")[7].item<std::int64_t>(), 7);
  EXPECT_EQ(micro.first_row, 1004);
}

TEST(Batch, LastSliceIsShorter) {
  Batch batch = example(10);
  Batch last = batch.slice(8, 4);
  EXPECT_EQ(last.rows(), 2);
  EXPECT_EQ(last.get("x").size(0), 2);
  EXPECT_TRUE(torch::equal(last.get("y"), torch::tensor({8, 9}, torch::kInt64)));
}

TEST(Batch, FieldsMustShareRows) {
  Batch b;
  b.add("x", torch::zeros({4, 2}));
  EXPECT_THROW(b.add("y", torch::zeros({5})), Error);
  EXPECT_THROW(b.get("z"), Error);
  EXPECT_THROW(b.slice(5, 1), Error);
}

}  // namespace
}  // namespace autoaccum::data
