#pragma once
// A fresh directory under the system's temporary one, removed with everything in it when the
// object goes: the kernel unit tests' stand-ins for /proc/sys, cgroups and /run/netns.

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace kproxy::testing {

struct TempDirectory {
  std::filesystem::path path;
  /// `prefix`: the start of the directory's name ("kproxy-sysctl").
  explicit TempDirectory(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    path = ::mkdtemp(pattern.data());
  }
  TempDirectory(const TempDirectory&) = delete;
  TempDirectory& operator=(const TempDirectory&) = delete;
  ~TempDirectory() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace kproxy::testing
