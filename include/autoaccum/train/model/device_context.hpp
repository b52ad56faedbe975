// The device the model runs on and the communicator its gradients travel through. --device
// cuda: the model, micro-batches and the reduce buffer live on this rank's GPU and the buffer
// goes through NCCL; the control plane stays on MPI.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

#include "autoaccum/comm/communicator.hpp"

namespace autoaccum::train {

struct DeviceContext {
  bool use_cuda = false;
  c10::Device device{c10::kCPU};
  std::unique_ptr<comm::Communicator> gradient_comm;
  at::Tensor on_device(const at::Tensor& t) const {
    return use_cuda ? t.to(device, /*non_blocking=*/true) : t;  // CPU: the view itself
  }
};

}  // namespace autoaccum::train
