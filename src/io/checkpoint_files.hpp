// Rotation of the checkpoint files beside `--checkpoint` (private to src/io; the public names
// are older_checkpoint_path and older_checkpoints in autoaccum/io/checkpoint.hpp).
#pragma once

#include <string>

namespace autoaccum::io {

inline constexpr const char* kCheckpointFormat = "autoaccum.checkpoint";

// Keeps the checkpoint now at `path` under its step's name, as a second name of the same file:
// `path` never goes missing, whenever a kill lands. Where the file system has no hard links, it
// is renamed instead (a kill before the new one's rename then leaves only the older name, which
// --resume finds). A file HDF5 cannot read is moved to `path`.damaged; another kind of file is
// not kept.
void keep_current(const std::string& path);
// Removes the kept checkpoints beyond the newest `keep - 1` (and a `.prev` of older versions,
// now that a newer checkpoint is whole). Best effort: a file that cannot be removed stays.
void remove_beyond(const std::string& path, int keep);

}  // namespace autoaccum::io
