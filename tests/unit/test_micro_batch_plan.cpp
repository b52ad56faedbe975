// MicroBatchPlan: budgets hold, every document lands in exactly one micro-batch, padding is on
// the right, and the token split between ranks is near-equal; checked against brute force.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <numeric>
#include <random>

#include "autoaccum/data/micro_batch_plan.hpp"

namespace autoaccum::data {
namespace {

std::vector<std::int64_t> random_lengths(std::size_t count, std::uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<std::int64_t> lengths(count);
  for (auto& n : lengths)
    n = 1 + static_cast<std::int64_t>(random() % 60);
  return lengths;
}

TEST(PlanDocuments, EveryDocumentOnceWithinTheBudgetLongestFirst) {
  for (std::uint32_t seed = 0; seed < 20; ++seed) {
    const auto lengths = random_lengths(5 + seed * 7, seed);
    const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    for (const std::int64_t budget : {longest, 2 * longest + 3, std::int64_t{1} << 20}) {
      const MicroBatchPlan plan = plan_documents(lengths, budget);
      std::vector<int> seen(lengths.size(), 0);
      std::int64_t tokens = 0, padded = 0, previous_width = longest + 1;
      for (const auto& piece : plan.pieces) {
        ASSERT_GE(piece.count, 1);
        EXPECT_LE(piece.size(), budget);
        EXPECT_LE(piece.width, previous_width);  // pieces come longest first
        previous_width = piece.width;
        std::int64_t piece_tokens = 0, piece_longest = 0;
        for (auto d : piece.documents) {
          ++seen[static_cast<std::size_t>(d)];
          piece_tokens += lengths[static_cast<std::size_t>(d)];
          piece_longest = std::max(piece_longest, lengths[static_cast<std::size_t>(d)]);
        }
        EXPECT_EQ(piece.width, piece_longest);
        EXPECT_EQ(piece.tokens, piece_tokens);
        tokens += piece_tokens;
        padded += piece.count * piece.width;
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      EXPECT_EQ(plan.tokens, std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}));
      EXPECT_EQ(plan.tokens, tokens);
      EXPECT_EQ(plan.padded_tokens, padded);
      if (budget >= padded_size(lengths)) {
        EXPECT_EQ(plan.pieces.size(), 1u);
      }
    }
  }
}

TEST(PlanDocuments, SortingByLengthPadsLessThanFileOrder) {
  const auto lengths = random_lengths(200, 7);
  const std::int64_t budget = 240;
  const MicroBatchPlan sorted = plan_documents(lengths, budget);
  // File order with the same budget: the most documents per micro-batch whose worst case fits.
  std::int64_t file_order = 0;
  const std::int64_t per = budget / 60;
  for (std::size_t i = 0; i < lengths.size(); i += static_cast<std::size_t>(per)) {
    const auto end = std::min(lengths.size(), i + static_cast<std::size_t>(per));
    file_order += static_cast<std::int64_t>(end - i) *
                  *std::max_element(lengths.begin() + static_cast<std::ptrdiff_t>(i),
                                    lengths.begin() + static_cast<std::ptrdiff_t>(end));
  }
  EXPECT_LT(sorted.padded_tokens, file_order);
  EXPECT_LT(static_cast<double>(sorted.padded_tokens - sorted.tokens),
            0.1 * static_cast<double>(sorted.tokens));
}

// Every way to cut the longest-first order into runs, one by one: visit(runs) with each run's
// (count, width), the width being its first (longest) document's.
template <class Visit>
void every_cut(std::vector<std::int64_t> lengths, Visit visit) {
  std::stable_sort(lengths.begin(), lengths.end(), std::greater<>());
  const std::size_t n = lengths.size();
  std::vector<std::pair<std::int64_t, std::int64_t>> runs;
  for (std::uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
    runs.clear();
    for (std::size_t start = 0; start < n;) {
      std::size_t end = start + 1;
      while (end < n && !(cuts & (1u << (end - 1))))
        ++end;
      runs.emplace_back(static_cast<std::int64_t>(end - start), lengths[start]);
      start = end;
    }
    visit(runs);
  }
}

bool within(const std::vector<std::pair<std::int64_t, std::int64_t>>& runs, std::int64_t budget) {
  return std::all_of(runs.begin(), runs.end(),
                     [&](const auto& r) { return r.first == 1 || r.first * r.second <= budget; });
}

// The fewest pieces that hold the budget, and the least padding among those.
std::pair<std::int64_t, std::int64_t> brute_force_cut(const std::vector<std::int64_t>& lengths,
                                                      std::int64_t budget) {
  std::pair<std::int64_t, std::int64_t> best{1 << 30, 0};
  every_cut(lengths, [&](const auto& runs) {
    std::int64_t padded = 0;
    for (const auto& [count, width] : runs)
      padded += count * width;
    const std::pair<std::int64_t, std::int64_t> here{static_cast<std::int64_t>(runs.size()),
                                                     padded};
    if (within(runs, budget) && here < best) best = here;
  });
  return best;
}

TEST(PlanDocuments, TheFewestPiecesAndTheLeastPaddingOfEveryPossibleCut) {
  std::int64_t greedy_padding = 0, plan_padding = 0;
  for (std::uint32_t seed = 0; seed < 200; ++seed) {
    const auto lengths = random_lengths(4 + seed % 11, seed + 1000);
    const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    const std::int64_t budget = longest + static_cast<std::int64_t>(seed % 7) * longest / 2;
    const MicroBatchPlan plan = plan_documents(lengths, budget);
    const auto [pieces, padded] = brute_force_cut(lengths, budget);
    ASSERT_EQ(static_cast<std::int64_t>(plan.pieces.size()), pieces) << "seed " << seed;
    ASSERT_EQ(plan.padded_tokens, padded) << "seed " << seed;
    // Against taking documents while they fit (the same number of pieces).
    std::vector<std::int64_t> sorted = lengths;
    std::stable_sort(sorted.begin(), sorted.end(), std::greater<>());
    std::int64_t greedy = 0, greedy_pieces = 0;
    for (std::size_t i = 0; i < sorted.size(); ++greedy_pieces) {
      std::size_t end = i + 1;
      while (end < sorted.size() && static_cast<std::int64_t>(end + 1 - i) * sorted[i] <= budget)
        ++end;
      greedy += static_cast<std::int64_t>(end - i) * sorted[i];
      i = end;
    }
    EXPECT_EQ(greedy_pieces, pieces);
    EXPECT_LE(padded, greedy);
    greedy_padding += greedy, plan_padding += padded;
  }
  EXPECT_LT(plan_padding, greedy_padding);  // the cut matters somewhere in 200 draws
}

// The least predicted time of every cut that holds the budget.
double brute_force_time(const std::vector<std::int64_t>& lengths, std::int64_t budget,
                        PieceCost time) {
  double best = std::numeric_limits<double>::infinity();
  every_cut(lengths, [&](const auto& runs) {
    double total = 0;
    for (const auto& [count, width] : runs)
      total += time.of(count, width);
    if (within(runs, budget)) best = std::min(best, total);
  });
  return best;
}

double plan_time(const MicroBatchPlan& plan, PieceCost time) {
  double total = 0;
  for (const auto& piece : plan.pieces)
    total += time.of(piece.count, piece.width);
  return total;
}

TEST(PlanDocuments, WithAPieceCostTheLeastPredictedTimeOfEveryPossibleCut) {
  std::int64_t fewer_padded = 0;
  for (std::uint32_t seed = 0; seed < 200; ++seed) {
    const auto lengths = random_lengths(4 + seed % 11, seed + 3000);
    const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    const std::int64_t budget = longest + static_cast<std::int64_t>(seed % 7) * longest / 2;
    const PieceCost time{static_cast<double>(seed % 5) * longest / 4,
                         seed % 3 == 0 ? 0.0 : 0.01 * (seed % 3)};
    const MicroBatchPlan plan = plan_documents(lengths, budget, {}, time);
    const double best = brute_force_time(lengths, budget, time);
    ASSERT_NEAR(plan_time(plan, time), best, 1e-9 * best) << "seed " << seed;
    std::int64_t total = 0;
    for (const auto& piece : plan.pieces) {
      EXPECT_TRUE(piece.count == 1 || piece.size() <= budget) << "seed " << seed;
      total += piece.count;
    }
    EXPECT_EQ(total, static_cast<std::int64_t>(lengths.size()));
    fewer_padded += plan_documents(lengths, budget).padded_tokens - plan.padded_tokens;
  }
  EXPECT_GT(fewer_padded, 0);  // a cheap piece buys less padding somewhere in 200 draws
}

TEST(PlanDocuments, APieceCostWhoseFixedPartDominatesCutsAsTheFewestPieces) {
  for (std::uint32_t seed = 0; seed < 100; ++seed) {
    const auto lengths = random_lengths(5 + seed % 40, seed + 5000);
    const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    const std::int64_t budget = longest * (1 + static_cast<std::int64_t>(seed % 9));
    // Above all padding the documents can have: one piece less always wins.
    const auto all = static_cast<std::int64_t>(lengths.size()) * longest;
    const MicroBatchPlan fewest = plan_documents(lengths, budget);
    const MicroBatchPlan timed = plan_documents(lengths, budget, {}, PieceCost{2.0 * all, 0});
    ASSERT_EQ(timed.pieces.size(), fewest.pieces.size()) << "seed " << seed;
    for (std::size_t p = 0; p < fewest.pieces.size(); ++p)
      EXPECT_EQ(timed.pieces[p].documents, fewest.pieces[p].documents) << "seed " << seed;
  }
}

TEST(PlanDocuments, VeryManyShortDocumentsUnderALargeBudgetAreCutGreedily) {
  // 300,000 documents of 1-3 tokens under a budget of 150,000: more than 2^24 runs to weigh.
  std::vector<std::int64_t> lengths(300000);
  for (std::size_t i = 0; i < lengths.size(); ++i)
    lengths[i] = 1 + static_cast<std::int64_t>(i % 3);
  const MicroBatchPlan plan = plan_documents(lengths, 150000);
  // Greedy, longest first: 50,000 of 3 twice, 75,000 of 2, then 25,000 of 2 with 50,000 of 1
  // at width 2 (padded 150,000), and the last 50,000 of 1. The least padding in 5 pieces would
  // end 25,000 of 2, then 125,000 of 1 (625,000 padded against 650,000).
  std::int64_t documents = 0;
  for (const auto& piece : plan.pieces) {
    EXPECT_LE(piece.size(), 150000);
    documents += piece.count;
  }
  EXPECT_EQ(documents, 300000);
  ASSERT_EQ(plan.pieces.size(), 5u);
  const std::vector<std::pair<std::int64_t, std::int64_t>> expected = {
      {50000, 3}, {50000, 3}, {75000, 2}, {75000, 2}, {50000, 1}};
  for (std::size_t p = 0; p < expected.size(); ++p) {
    EXPECT_EQ(plan.pieces[p].count, expected[p].first) << "piece " << p;
    EXPECT_EQ(plan.pieces[p].width, expected[p].second) << "piece " << p;
  }
  EXPECT_EQ(plan.padded_tokens, 650000);
}

TEST(PlanDocuments, AWidthCostLetsNarrowPiecesTakeMoreTokensForTheSameCost) {
  // 4 documents of 256 tokens, then 40 of 32. Budget 1024 tokens, predicted at width 256.
  std::vector<std::int64_t> lengths(4, 256);
  lengths.insert(lengths.end(), 40, 32);
  const auto plain = plan_documents(lengths, 1024);
  const double ratio = 1.0 / 64;  // a token at width 256 costs 5x, at width 32 1.5x
  const auto weighed = plan_documents(lengths, 1024, WidthCost{ratio, 256});
  // The wide documents cut alike; the narrow ones 32 per piece by tokens alone, and 3.33x as
  // many tokens (5 / 1.5) by cost: 40 of them in one piece of 1280 tokens.
  ASSERT_EQ(plain.pieces.size(), 3u);
  EXPECT_EQ(plain.pieces[1].count, 32);
  ASSERT_EQ(weighed.pieces.size(), 2u);
  EXPECT_EQ(weighed.pieces[0].count, 4);
  EXPECT_EQ(weighed.pieces[1].count, 40);
  EXPECT_EQ(weighed.tokens, plain.tokens);
  const double allowed = 1024 * (1 + ratio * 256);
  for (const auto& piece : weighed.pieces) {
    const auto w = static_cast<double>(piece.width);
    EXPECT_LE(static_cast<double>(piece.count) * w * (1 + ratio * w), allowed);
  }
  // No ratio: the padded-token budget exactly as before.
  const auto zero = plan_documents(lengths, 1024, WidthCost{0.0, 256});
  ASSERT_EQ(zero.pieces.size(), plain.pieces.size());
  for (std::size_t i = 0; i < zero.pieces.size(); ++i)
    EXPECT_EQ(zero.pieces[i].documents, plain.pieces[i].documents);
}

TEST(NarrowPiece, TheNarrowestPieceOfHalfTheBudgetOrNoneWhenTheWidthsAreAlike) {
  // Budget 1024: 4 x 256 | 16 x 64 | 32 x 32 | 6 x 16 (the last holds under half the budget).
  std::vector<std::int64_t> lengths(4, 256);
  lengths.insert(lengths.end(), 16, 64);
  lengths.insert(lengths.end(), 32, 32);
  lengths.insert(lengths.end(), 6, 16);
  const auto plan = plan_documents(lengths, 1024);
  ASSERT_EQ(plan.pieces.size(), 4u);
  ASSERT_EQ(plan.pieces[2].width, 32);
  ASSERT_EQ(plan.pieces[3].width, 16);
  EXPECT_EQ(narrow_piece(plan, 1024), std::optional<std::size_t>(2));
  // A budget the narrow pieces hold under half of: none of them is measured.
  EXPECT_EQ(narrow_piece(plan, 4096), std::nullopt);
  // Documents within 3/4 of the longest: nothing to tell widths apart by.
  const auto alike = plan_documents(std::vector<std::int64_t>(40, 100), 1000);
  EXPECT_EQ(narrow_piece(alike, 1000), std::nullopt);
  std::vector<std::int64_t> near(10, 100);
  near.insert(near.end(), 20, 76);
  EXPECT_EQ(narrow_piece(plan_documents(near, 1000), 1000), std::nullopt);
  near.insert(near.end(), 20, 75);
  const auto with_75 = plan_documents(near, 1000);
  const auto chosen = narrow_piece(with_75, 1000);
  ASSERT_TRUE(chosen.has_value());
  EXPECT_EQ(with_75.pieces[*chosen].width, 75);
  // Rows have no width.
  EXPECT_EQ(narrow_piece(plan_rows(64, 16), 16), std::nullopt);
  EXPECT_EQ(narrow_piece(MicroBatchPlan{}, 16), std::nullopt);
}

TEST(TokenBalancedOffsets, ContiguousNonEmptyAndNearEqual) {
  for (std::uint32_t seed = 0; seed < 30; ++seed) {
    const auto lengths = random_lengths(4 + seed, seed + 100);
    const std::int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    const std::int64_t total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
    for (int world = 1; world <= 4; ++world) {
      const auto count = static_cast<std::int64_t>(lengths.size());
      const auto offsets = token_balanced_offsets(lengths.data(), count, world);
      ASSERT_EQ(offsets.size(), static_cast<std::size_t>(world) + 1);
      EXPECT_EQ(offsets.front(), 0);
      EXPECT_EQ(offsets.back(), count);
      for (int r = 0; r < world; ++r) {
        const auto begin = offsets[static_cast<std::size_t>(r)];
        const auto end = offsets[static_cast<std::size_t>(r) + 1];
        ASSERT_LT(begin, end);
        const std::int64_t share =
            std::accumulate(lengths.begin() + begin, lengths.begin() + end, std::int64_t{0});
        // Each rank is within one document of an equal share (clamps aside: a rank must get
        // one document, so only check when every document is at most the fair share).
        if (longest * world <= total) {
          EXPECT_LE(std::abs(share * world - total), longest * world) << seed << " " << r;
        }
      }
    }
  }
}

TEST(TokenBalancedOffsets, WeightsMoveTheCutsAndEqualWeightsChangeNothing) {
  const std::vector<std::int64_t> lengths(40, 10);  // 400 tokens
  const auto even = token_balanced_offsets(lengths.data(), 40, 2);
  EXPECT_EQ(even, token_balanced_offsets(lengths.data(), 40, 2, {7, 7}));
  EXPECT_EQ(even, std::vector<std::int64_t>({0, 20, 40}));
  EXPECT_EQ(token_balanced_offsets(lengths.data(), 40, 2, {3, 1}),
            std::vector<std::int64_t>({0, 30, 40}));
  EXPECT_EQ(token_balanced_offsets(lengths.data(), 40, 3, {1, 2, 1}),
            std::vector<std::int64_t>({0, 10, 30, 40}));
  // A weight too small for a document still leaves every rank one.
  EXPECT_EQ(token_balanced_offsets(lengths.data(), 40, 2, {1, 1000000}),
            std::vector<std::int64_t>({0, 1, 40}));
}

TEST(MicroBatch, DocumentsArePaddedOnTheRightWithTheirNextTokens) {
  auto documents = std::make_shared<Documents>();
  documents->tokens = torch::tensor({1, 2, 3, 4, 5, 6}, torch::kInt64);
  documents->offsets = {0, 1, 4, 6};  // [1], [2, 3, 4], [5, 6]
  documents->ignore_index = -7;
  documents->lengths_input = true;
  Batch slab;
  slab.set_documents(documents);
  ASSERT_EQ(slab.rows(), 3);
  const MicroBatchPlan plan = plan_micro_batches(slab, 100);
  ASSERT_EQ(plan.pieces.size(), 1u);
  const Batch micro = micro_batch(slab, plan.pieces.front());
  ASSERT_EQ(micro.size(), 3u);
  EXPECT_TRUE(micro[0].equal(torch::tensor({{2, 3, 4}, {5, 6, 0}, {1, 0, 0}}, torch::kInt64)));
  EXPECT_TRUE(micro[1].equal(torch::tensor({3, 2, 1}, torch::kInt64)));
  EXPECT_TRUE(
      micro[2].equal(torch::tensor({{3, 4, -7}, {6, -7, -7}, {-7, -7, -7}}, torch::kInt64)));
  // A budget of 4 tokens: the 3-token document alone, then the two others padded to 2.
  const MicroBatchPlan small = plan_micro_batches(slab, 4);
  ASSERT_EQ(small.pieces.size(), 2u);
  EXPECT_EQ(small.pieces[0].documents, std::vector<std::int64_t>({1}));
  EXPECT_EQ(small.pieces[1].documents, std::vector<std::int64_t>({2, 0}));
  EXPECT_EQ(small.padded_tokens, 3 + 4);
}

TEST(WidenPiece, AProbePieceIsMeasuredAtTheDataWidthWithinItsBudget) {
  auto documents = std::make_shared<Documents>();
  documents->tokens = torch::arange(20, torch::kInt64);
  documents->offsets = {0, 4, 8, 11, 14, 17, 20};  // lengths 4, 4, 3, 3, 3, 3
  Batch slab;
  slab.set_documents(documents);
  const MicroBatchPlan plan = plan_micro_batches(slab, 16);
  ASSERT_EQ(plan.pieces.size(), 2u);  // 2 x 4, then 4 x 3 (fewest pieces)
  // Data 8 wide: the first piece keeps 16 / 8 = 2 of its documents, padded to 8.
  MicroBatchPiece piece = plan.pieces.front();
  widen_piece(slab, piece, 8, 16);
  EXPECT_EQ(piece.width, 8);
  EXPECT_EQ(piece.count, 2);
  EXPECT_EQ(piece.size(), 16);
  EXPECT_EQ(piece.tokens, 8);
  const Batch micro = micro_batch(slab, piece);
  EXPECT_EQ(micro[0].sizes(), (c10::IntArrayRef{2, 8}));
  // A budget of one data-wide document keeps one; a piece as wide already is unchanged.
  MicroBatchPiece second = plan.pieces[1];
  widen_piece(slab, second, 8, 8);
  EXPECT_EQ(second.count, 1);
  EXPECT_EQ(second.width, 8);
  MicroBatchPiece same = plan.pieces.front();
  widen_piece(slab, same, 4, 16);
  EXPECT_EQ(same.documents, plan.pieces.front().documents);
  EXPECT_EQ(same.width, 4);
  // Rows have no width to widen.
  MicroBatchPiece rows = plan_rows(64, 16).pieces.front();
  widen_piece(Batch{}, rows, 8, 16);
  EXPECT_EQ(rows.count, 16);
}

}  // namespace
}  // namespace autoaccum::data
