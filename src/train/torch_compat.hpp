// The one place for differences between the LibTorch versions autoaccum builds with (Debian 12's
// 1.13, 2.x on clusters) that the train module meets. Include only from .cpp files.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace autoaccum::train::compat {

// The key under which an optimizer keeps a parameter's state: its TensorImpl address, spelt as
// a string in LibTorch 1.x and as the pointer itself in 2.x. Deduced from the map's key type.
template <class StateMap>
typename StateMap::key_type optimizer_state_key(const at::Tensor& parameter) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // what c10::guts::to_string writes for a pointer
    text << parameter.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

}  // namespace autoaccum::train::compat
