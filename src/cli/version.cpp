// version_lines: what autoaccum was built with and what it runs on.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <hdf5.h>
#include <link.h>
#include <mpi.h>
#include <torch/version.h>

#include <algorithm>
#include <boost/version.hpp>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autoaccum/cli/app.hpp"
#include "autoaccum/comm/nccl_communicator.hpp"
#include "autoaccum/memory/memory.hpp"
#include "autoaccum/version.hpp"

namespace autoaccum::cli {
namespace {

// The BLAS library actually loaded: Debian's LibTorch runs 10-20x slower on the reference BLAS
// than on OpenBLAS, and which one is used depends on the alternatives system, not on the build.
std::string loaded_blas() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const auto slash = name.rfind('/');
        const std::string base = name.substr(slash == std::string::npos ? 0 : slash + 1);
        if (base.rfind("libblas.so", 0) == 0 || base.rfind("libopenblas", 0) == 0 ||
            base.rfind("libmkl_rt", 0) == 0) {
          char resolved[PATH_MAX];
          auto* out = static_cast<std::string*>(data);
          if (out->empty()) *out = realpath(name.c_str(), resolved) ? resolved : name;
        }
        return 0;
      },
      &found);
  if (found.empty()) return "none loaded";
  if (found.find("/blas/libblas") != std::string::npos) {
    return found + " (reference BLAS: slow; install libopenblas0-openmp)";
  }
  return found;
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text,
                      std::min<std::size_t>(static_cast<std::size_t>(length), std::strlen(text)));
  const auto newline = version.find_first_of("\r\n");
  if (newline != std::string::npos) version.resize(newline);
  while (!version.empty() &&
         (version.back() == ',' || std::isspace(static_cast<unsigned char>(version.back())))) {
    version.pop_back();
  }
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  return version + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}

std::string hdf5_library() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  hbool_t threadsafe = 0;
  H5is_library_threadsafe(&threadsafe);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release) +
         (threadsafe ? " (thread-safe)" : " (not thread-safe; autoaccum serialises its calls)");
}

}  // namespace

std::vector<std::string> version_lines() {
  const std::string nccl = comm::nccl_built() ? comm::nccl_version() + " (CUDA devices visible: " +
                                                    std::to_string(comm::cuda_device_count()) + ")"
                                              : std::string("not built");
  return {
      std::string("autoaccum ") + kVersion + " (" + kBuildType + ")",
      std::string("LibTorch  ") + TORCH_VERSION +
          (kWithCuda ? " (CUDA, GPUs visible: " + std::to_string(memory::cuda_devices().count) + ")"
                     : std::string(" (CPU)")) +
          ", intra-op threads " + std::to_string(at::get_num_threads()),
      "BLAS      " + loaded_blas(),
      "MPI       " + mpi_library(),
      "HDF5      " + hdf5_library(),
      "NCCL      " + nccl,
      "Boost     " + std::to_string(BOOST_VERSION / 100000) + "." +
          std::to_string(BOOST_VERSION / 100 % 1000) + "." + std::to_string(BOOST_VERSION % 100),
  };
}

}  // namespace autoaccum::cli
