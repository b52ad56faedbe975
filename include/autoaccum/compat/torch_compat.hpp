// The one place for differences between the LibTorch versions autoaccum builds with: Debian 12's
// 1.13 and 2.x (Debian 13's 2.6, the LibTorch inside a PyTorch wheel on clusters and GPUs).
// Every version test in the code is here; include only from .cpp files of modules that link
// LibTorch. jobs/ci/debian13.sh builds and tests against 2.6 in CI.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>  // TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR

#include <sstream>
#include <string>
#include <type_traits>

#define AUTOACCUM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator: `allocate` is const up to 2.2 and not const from 2.3 on, where `copy_data`
// also became pure virtual. An allocator declares
//   c10::DataPtr allocate(size_t n) AUTOACCUM_ALLOCATE_CONST override;
// and, from 2.3 on (AUTOACCUM_ALLOCATOR_HAS_COPY_DATA), copy_data.
#if AUTOACCUM_TORCH_AT_LEAST(2, 3)
#define AUTOACCUM_ALLOCATE_CONST
#define AUTOACCUM_ALLOCATOR_HAS_COPY_DATA 1
#else
#define AUTOACCUM_ALLOCATE_CONST const
#define AUTOACCUM_ALLOCATOR_HAS_COPY_DATA 0
#endif

namespace autoaccum::compat {

// The LibTorch this file was compiled against, as "2.6.0".
inline const char* torch_version() {
  return TORCH_VERSION;
}

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

// Autocast's thread-local state for one device type (CPU or CUDA): whether it is on, and the
// dtype it lowers matrix products and convolutions to. LibTorch 2.4 made these functions of the
// device type; 1.13 has one pair of functions per device.
struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
};

inline AutocastState autocast_state(c10::DeviceType device) {
#if AUTOACCUM_TORCH_AT_LEAST(2, 4)
  return {at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
#else
  if (device == c10::DeviceType::CUDA)
    return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
  return {at::autocast::is_cpu_enabled(), at::autocast::get_autocast_cpu_dtype()};
#endif
}

inline void set_autocast_state(c10::DeviceType device, const AutocastState& state) {
#if AUTOACCUM_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device, state.dtype);
  at::autocast::set_autocast_enabled(device, state.enabled);
#else
  if (device == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(state.dtype);
    at::autocast::set_enabled(state.enabled);
  } else {
    at::autocast::set_autocast_cpu_dtype(state.dtype);
    at::autocast::set_cpu_enabled(state.enabled);
  }
#endif
}

}  // namespace autoaccum::compat
