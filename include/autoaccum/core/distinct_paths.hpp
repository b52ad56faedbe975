// Outputs apart from inputs: no file a command writes may be one it reads, or another it writes.
#pragma once

#include <string>
#include <vector>

namespace autoaccum::core {

// A path as the user named it, with the option that named it ("--data", "--checkpoint").
struct NamedPath {
  std::string option;
  std::string path;
};

// Whether `a` and `b` name the same file: the same device and inode when both exist (a hard or
// symbolic link counts), else the same absolute path once the existing folders on the way are
// resolved (a file not written yet in a linked folder counts too).
bool same_file(const std::string& a, const std::string& b);

// Throws UsageError, before anything is written, when an output names an input or another
// output: "--checkpoint 'd.h5' is the same file as --data 'd.h5': an output must not overwrite
// an input; nothing was written". Empty paths are skipped.
void check_outputs_apart(const std::vector<NamedPath>& inputs,
                         const std::vector<NamedPath>& outputs);

}  // namespace autoaccum::core
