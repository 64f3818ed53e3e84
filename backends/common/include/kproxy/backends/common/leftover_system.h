#pragma once
/// LeftoverSystem: what the backends' leftover cleanup works on (tools, files, processes and
/// nftables tables by name), so that each backend's cleanup of what upstream kube-proxy leaves
/// (kproxy/iptables/leftovers.h, kproxy/ipvs/leftovers.h, kproxy/nftables/leftovers.h) runs
/// against the real system, a printer of what it would change (--cleanup --dry-run) or, in
/// tests, a fake.
/// Thread-safety: not thread-safe; one cleanup at a time.

#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::backends {

/// Output of a finished command.
struct CommandResult {
  int exitCode = 0;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// The system the cleanup works on. The real one runs programs; tests use a fake.
class LeftoverSystem {
 public:
  virtual ~LeftoverSystem() = default;
  /// Full path of an executable found in PATH or the sbin directories, if any.
  virtual std::optional<std::string> findTool(std::string_view name) = 0;
  virtual bool pathExists(const std::string& path) = 0;
  /// Runs argv (argv[0] a full path) that only reads the system (`iptables-save`, `ipset list`).
  /// An error only when it could not run.
  virtual core::Result<CommandResult> query(const std::vector<std::string>& argv) = 0;
  /// Runs argv with `input` on stdin to change the system (`iptables-restore`, `ipset
  /// destroy`). An error only when it could not run.
  virtual core::Result<CommandResult> change(const std::vector<std::string>& argv, std::string_view input) = 0;
  /// Deletes the nftables table `name` of `family` ("ip" or "ip6") in one netlink transaction;
  /// whether it existed. Never lists the ruleset: `nft list tables` (nft 1.0.6) reads every
  /// rule, which costs seconds of CPU on a node holding iptables-nft's rules (BENCHMARKS.md,
  /// "Figures behind the code"). An error of errno EPROTONOSUPPORT / EAFNOSUPPORT when the
  /// kernel has no nftables.
  virtual core::Result<bool> deleteNftablesTable(std::string_view family, std::string_view name) = 0;
  /// Detaches the BPF links pinned in `dir` (a directory on a bpf filesystem), removes its pins
  /// and the directory; whether it existed (kproxy/kernel/bpf_pins.h).
  virtual core::Result<bool> removeBpfPins(const std::string& dir) = 0;
};

/// The real system: the process runner (a minute's timeout per command), /proc and /sys, and
/// netlink.
class RealLeftoverSystem : public LeftoverSystem {
 public:
  std::optional<std::string> findTool(std::string_view name) override;
  bool pathExists(const std::string& path) override;
  core::Result<CommandResult> query(const std::vector<std::string>& argv) override;
  core::Result<CommandResult> change(const std::vector<std::string>& argv, std::string_view input) override;
  core::Result<bool> deleteNftablesTable(std::string_view family, std::string_view name) override;
  core::Result<bool> removeBpfPins(const std::string& dir) override;
};

/// --cleanup --dry-run: reads go to `system`; every change is printed to `out` (the command,
/// then its stdin) and succeeds without running. A table deletion is printed as
/// `nft delete table FAMILY NAME` and reports that nothing was deleted.
class PrintingLeftoverSystem : public LeftoverSystem {
 public:
  PrintingLeftoverSystem(LeftoverSystem& system, std::FILE* out) : system_(system), out_(out) {}
  std::optional<std::string> findTool(std::string_view name) override { return system_.findTool(name); }
  bool pathExists(const std::string& path) override { return system_.pathExists(path); }
  core::Result<CommandResult> query(const std::vector<std::string>& argv) override { return system_.query(argv); }
  core::Result<CommandResult> change(const std::vector<std::string>& argv, std::string_view input) override;
  core::Result<bool> deleteNftablesTable(std::string_view family, std::string_view name) override;
  /// Printed as `remove bpf pins DIR` when DIR exists; reports that nothing was removed.
  core::Result<bool> removeBpfPins(const std::string& dir) override;

 private:
  LeftoverSystem& system_;
  std::FILE* out_;
};

/// For the cleanup's logs: the first line of a tool's message, leading blanks skipped.
std::string firstLine(std::string_view text);
/// For the cleanup's logs: at most `limit` names joined with ",", then ",..." if there are more.
std::string joinNames(const std::vector<std::string>& names, std::size_t limit = 20);

}  // namespace kproxy::backends
