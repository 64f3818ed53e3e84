#pragma once
/// Exits kproxy when its --config file changes, as upstream's runLoop does (options.go,
/// initWatcher / eventHandler): the file itself is watched (a symbolic link is followed), and a
/// write to it or its rename ends the process with an error, for the DaemonSet or unit to
/// restart it with the new file. Upstream watches with fsnotify and acts on its Write and Rename
/// events only; this does the same with inotify (IN_MODIFY, IN_MOVE_SELF), so a file replaced by
/// renaming another over it (its old inode removed) is, as upstream, not noticed.
/// Thread-safety: the callback runs on the watcher's own thread, once.

#include <functional>
#include <memory>
#include <string>

#include "kproxy/core/error.h"

namespace kproxy::cli {

class ConfigFileWatcher {
 public:
  /// Starts watching `path`; `changed` is called once, with upstream's message, when it is
  /// written or renamed. An error when the file cannot be watched.
  static core::Result<std::unique_ptr<ConfigFileWatcher>> start(const std::string& path,
                                                                std::function<void(const std::string&)> changed);
  ~ConfigFileWatcher();
  ConfigFileWatcher(const ConfigFileWatcher&) = delete;
  ConfigFileWatcher& operator=(const ConfigFileWatcher&) = delete;

 private:
  struct State;
  explicit ConfigFileWatcher(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kproxy::cli
