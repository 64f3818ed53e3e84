#pragma once
/// Reading and writing kernel parameters as files under a root directory: /proc/sys for
/// sysctls, or e.g. /sys/module/nf_conntrack/parameters. The root is injected so tests use a
/// temporary directory. Sysctls is the same as an interface, for the backends: the files, a
/// fake in memory, and a printer for --dry-run.
/// Thread-safety: a SysctlFiles is immutable; concurrent writes of one file race as they would
/// for any two writers. A Sysctls is used by one thread at a time.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
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

/// The kernel parameters a backend sets (IPVS mode's net/ipv4/vs/*, iptables mode's
/// route_localnet), named by their path under /proc/sys ("net/ipv4/vs/conntrack"). A backend
/// takes one, so that tests give it a fake and --dry-run a printer.
class Sysctls {
 public:
  virtual ~Sysctls() = default;
  /// The value; an error (ENOENT when the parameter does not exist) when it cannot be read.
  virtual core::Result<std::int64_t> readInt(const std::string& name) = 0;
  /// Sets it; a missing parameter is an error (ENOENT), never created.
  virtual core::Result<void> writeInt(const std::string& name, std::int64_t value) = 0;
};

/// The files under `root` (/proc/sys, or a directory that looks like it in tests).
std::unique_ptr<Sysctls> makeFileSysctls(std::filesystem::path root = "/proc/sys");

/// In memory: the parameters in `values` exist, any other is missing (ENOENT), as in a kernel
/// without it. Errors read as the files' do, marked "(fake)".
class FakeSysctls final : public Sysctls {
 public:
  explicit FakeSysctls(std::map<std::string, std::int64_t> initial = {}) : values(std::move(initial)) {}
  core::Result<std::int64_t> readInt(const std::string& name) override;
  core::Result<void> writeInt(const std::string& name, std::int64_t value) override;

  std::map<std::string, std::int64_t> values;
  std::size_t writes = 0;  ///< writes that succeeded
};

/// --dry-run: each write printed to `out` in sysctl(8) notation (`sysctl -w
/// net.ipv4.vs.conntrack=1`), then handed to `inner`, which answers every read. A write the
/// inner refuses is printed too: the kernel would have been asked for it.
class PrintingSysctls final : public Sysctls {
 public:
  PrintingSysctls(std::unique_ptr<Sysctls> inner, std::FILE* out) : inner_(std::move(inner)), out_(out) {}
  core::Result<std::int64_t> readInt(const std::string& name) override { return inner_->readInt(name); }
  core::Result<void> writeInt(const std::string& name, std::int64_t value) override;

 private:
  std::unique_ptr<Sysctls> inner_;
  std::FILE* out_;
};

}  // namespace kproxy::kernel
