// autoaccum: every rank runs this; spmd_main makes the ranks leave together.
#include "autoaccum/cli/app.hpp"
#include "autoaccum/cli/spmd_main.hpp"

int main(int argc, char** argv) {
  return autoaccum::cli::spmd_main(argc, argv, autoaccum::cli::run_app, autoaccum::cli::needs_mpi);
}
