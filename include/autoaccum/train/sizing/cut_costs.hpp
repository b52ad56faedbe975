// Documents: what each rank weighs when it cuts its share into micro-batches under its budget,
// fixed for the run so that every rank cuts every rank's pieces alike (and a resume on the same
// ranks takes them from the checkpoint): the memory cost of a token at each width (--token-cost
// memory, from the memory models at the probe) and the time a micro-batch is predicted to take
// (--micro-batch-cost auto, fitted by the time probe; or fixed=F,width=X, given).
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "autoaccum/data/micro_batch_plan.hpp"
#include "autoaccum/train/options.hpp"
#include "autoaccum/train/sizing/time_model.hpp"

namespace autoaccum::train {

struct CutCosts {
  std::vector<data::WidthCost> width_costs;       // per rank; empty: every padded token alike
  std::vector<std::optional<TimeFit>> time_fits;  // per rank; empty: none fitted

  data::WidthCost width_cost(int r) const {
    const auto i = static_cast<std::size_t>(r);
    return i < width_costs.size() ? width_costs[i] : data::WidthCost{};
  }
  std::optional<TimeFit> time_fit(int r) const {
    const auto i = static_cast<std::size_t>(r);
    return i < time_fits.size() ? time_fits[i] : std::nullopt;
  }
  // What rank r's cut minimises besides the number of pieces under `options`: the given cost,
  // its fitted one (auto), or nothing (the fewest pieces).
  std::optional<data::PieceCost> piece_cost(const TrainOptions& options, int r) const {
    using Cost = TrainOptions::MicroBatchCost;
    if (options.micro_batch_cost == Cost::kGiven)
      return data::PieceCost{options.cost_fixed, options.cost_width};
    if (options.micro_batch_cost != Cost::kAuto) return std::nullopt;
    if (const auto fit = time_fit(r)) return fit->piece_cost();
    return std::nullopt;
  }
};

}  // namespace autoaccum::train
