// ModelBundle: the network a run trains and what belongs to it, owned together: the model, the
// objective its data's targets call for, its distinct parameters (trainable and frozen), and what
// an attempt changes besides gradients (ModelState: buffers, random generators). The run builds
// it at set-up; the step runs forward, loss and backward through it; evaluation and checkpoints
// read it.
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "autoaccum/train/model/model.hpp"
#include "autoaccum/train/model/model_state.hpp"
#include "autoaccum/train/model/objective.hpp"

namespace autoaccum::train {

class ModelBundle {
 public:
  // `model` as built (seeded alike on every rank, or loaded from one file), in train mode from
  // here on (a file saved after model.eval() would otherwise train with dropout off and
  // BatchNorm frozen); its parameters are read once, here.
  ModelBundle(std::unique_ptr<Model> model, Objective objective);

  // What an attempt changes besides gradients, held on `device` for `world` ranks: made once
  // the model is on its device (an out-of-memory here is the caller's to name).
  void hold_state(c10::Device device, int world, int rank);

  Model& model() const { return *model_; }
  const Objective& objective() const { return objective_; }
  const ParameterSet& parameters() const { return parameters_; }
  ModelState& state() const { return *state_; }

  // "why" when nothing in it trains (every parameter frozen, or none: a frozen TorchScript
  // file), else "".
  std::string nothing_to_train() const;
  // For the banner: the model, its parameters, and the buffer values averaged over the ranks.
  std::string describe() const;

 private:
  std::unique_ptr<Model> model_;
  Objective objective_;
  ParameterSet parameters_;
  std::unique_ptr<ModelState> state_;
};

}  // namespace autoaccum::train
