#pragma once
/// Reading and writing kernel parameters as files under a root directory: /proc/sys for
/// sysctls, or e.g. /sys/module/nf_conntrack/parameters. The root is injected so tests use a
/// temporary directory.
/// Thread-safety: a SysctlFiles is immutable; concurrent writes of one file race as they would
/// for any two writers.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "kproxy/core/error.h"

namespace kproxy::kernel {

class SysctlFiles {
 public:
  explicit SysctlFiles(std::filesystem::path root = "/proc/sys") : root_(std::move(root)) {}

  /// The file of `name`, a path relative to the root ("net/ipv4/ip_forward"); slashes, not
  /// dots, because interface names may hold dots.
  std::filesystem::path pathOf(std::string_view name) const { return root_ / name; }

  /// The value's first line without trailing whitespace. Error (kIo, with errno: ENOENT when
  /// missing) when it cannot be read.
  core::Result<std::string> read(std::string_view name) const;
  /// The value as an integer; kDecode when it is not one.
  core::Result<std::int64_t> readInt(std::string_view name) const;

  /// Writes `value` and a newline. Never creates the file: a missing sysctl is an error with
  /// errno ENOENT, a read-only one EACCES / EPERM / EROFS, a value the kernel refuses EINVAL.
  core::Result<void> write(std::string_view name, std::string_view value) const;
  core::Result<void> writeInt(std::string_view name, std::int64_t value) const;

 private:
  std::filesystem::path root_;
};

/// Whether this kernel can carry IPv6 (as upstream, a family is programmed only where the kernel
/// supports it): IPv6 compiled in and not disabled with net.ipv6.conf.all.disable_ipv6.
bool kernelHasIPv6(const SysctlFiles& sysctls = SysctlFiles());

}  // namespace kproxy::kernel
