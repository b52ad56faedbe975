# Compiler settings shared by every target: warnings, ccache, LibTorch precompiled header.

find_program(AUTOACCUM_CCACHE ccache)
if(AUTOACCUM_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  # Precompiled headers are cacheable only with these sloppiness settings.
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=1
      ${AUTOACCUM_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
  message(STATUS "ccache: ${AUTOACCUM_CCACHE}")
endif()

function(autoaccum_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wno-unused-parameter)
  if(AUTOACCUM_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# One precompiled <torch/torch.h> shared by every target that includes LibTorch: building it
# costs about as much as one LibTorch translation unit (~25 s on 2 cores), so it is built once.
# Targets reusing it must have the same compile options, hence the fixed option set here.
function(autoaccum_torch_target target)
  if(NOT TARGET autoaccum_torch_pch)
    add_library(autoaccum_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp)
    target_link_libraries(autoaccum_torch_pch PUBLIC torch)
    target_precompile_headers(autoaccum_torch_pch PRIVATE <torch/torch.h>)
    autoaccum_warnings(autoaccum_torch_pch)
    set_target_properties(autoaccum_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  endif()
  target_precompile_headers(${target} REUSE_FROM autoaccum_torch_pch)
endfunction()
