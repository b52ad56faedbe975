# Finds LibTorch, MPI, HDF5, Boost.ProgramOptions, and optionally CUDA + NCCL.

find_package(Torch REQUIRED)
# Debian's TorchConfig adds -D_GLIBCXX_USE_CXX11_ABI etc. through TORCH_CXX_FLAGS; keep them.
find_package(MPI REQUIRED COMPONENTS C CXX)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(Boost 1.71 REQUIRED COMPONENTS program_options)
find_package(ZLIB REQUIRED)
# xxHash (Debian's libxxhash-dev): the checksums of checkpoints and data files.
find_path(XXHASH_INCLUDE_DIR xxhash.h HINTS $ENV{XXHASH_HOME}/include)
find_library(XXHASH_LIBRARY xxhash HINTS $ENV{XXHASH_HOME}/lib)
if(NOT XXHASH_INCLUDE_DIR OR NOT XXHASH_LIBRARY)
  message(FATAL_ERROR "xxHash not found: install libxxhash-dev (jobs/setup.sh), or set XXHASH_HOME")
endif()
add_library(autoaccum_xxhash INTERFACE)
target_include_directories(autoaccum_xxhash SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(autoaccum_xxhash INTERFACE ${XXHASH_LIBRARY})
find_package(Threads REQUIRED)

# CUDA code paths need a LibTorch built with CUDA (libc10_cuda); Debian's is CPU-only.
set(AUTOACCUM_HAVE_CUDA OFF)
if(NOT AUTOACCUM_WITH_CUDA STREQUAL "OFF")
  if(TARGET c10_cuda OR TORCH_CUDA_LIBRARIES)
    set(AUTOACCUM_HAVE_CUDA ON)
  elseif(AUTOACCUM_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "AUTOACCUM_WITH_CUDA=ON but the LibTorch found (${Torch_DIR}) was built without CUDA")
  endif()
endif()

# NCCL needs the CUDA runtime (not a CUDA LibTorch): the communicator moves raw device buffers.
set(AUTOACCUM_HAVE_NCCL OFF)
if(NOT AUTOACCUM_WITH_NCCL STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib)
  endif()
  if(CUDAToolkit_FOUND AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(AUTOACCUM_HAVE_NCCL ON)
    add_library(autoaccum_nccl INTERFACE)
    target_include_directories(autoaccum_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(autoaccum_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
    message(STATUS "NCCL: ${NCCL_LIBRARY} (CUDA ${CUDAToolkit_VERSION})")
  elseif(AUTOACCUM_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "AUTOACCUM_WITH_NCCL=ON but the CUDA toolkit or NCCL was not found "
                        "(set CUDAToolkit_ROOT or NCCL_HOME)")
  endif()
endif()
