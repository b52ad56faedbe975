// The model, its objective, parameters and attempt state, owned together.
#include "autoaccum/train/model/model_bundle.hpp"

#include <sstream>
#include <utility>

namespace autoaccum::train {

ModelBundle::ModelBundle(std::unique_ptr<Model> model, Objective objective)
    : model_(std::move(model)), objective_(std::move(objective)) {
  model_->set_training(true);
  parameters_ = model_->parameter_set();
}

void ModelBundle::hold_state(c10::Device device, int world, int rank) {
  state_ = std::make_unique<ModelState>(*model_, device, world, rank);
}

std::string ModelBundle::nothing_to_train() const {
  if (parameters_.trainable_elements > 0) return "";
  if (parameters_.frozen_elements > 0) {
    return "all " + std::to_string(parameters_.frozen_elements) +
           " of its parameter elements have requires_grad=False";
  }
  return "it has no parameters (a file saved with torch.jit.freeze holds its weights as "
         "constants; save torch.jit.script(model) without freeze)";
}

std::string ModelBundle::describe() const {
  std::ostringstream text;
  text << model_->describe() << ": " << parameters_.describe();
  if (state_ && state_->averaged_values() > 0) {
    text << "; " << state_->averaged_values()
         << " buffer value(s) averaged over the ranks every step";
  }
  return text.str();
}

}  // namespace autoaccum::train
