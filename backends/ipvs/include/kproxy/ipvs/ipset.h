#pragma once
/// KernelIpsets: the ipsets IPVS mode matches in iptables, read with `ipset save` and changed
/// with `ipset restore -exist` through the shared process runner (no shell). `-exist` makes
/// every line idempotent: creating an existing set of the same type, adding a present entry and
/// deleting an absent one are not errors, so a restore can be repeated after a failure.
/// FakeIpsets applies restore input to an in-memory table, for unit tests and --dry-run.
/// Thread-safety: one caller at a time.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/backends/common/process.h"
#include "kproxy/core/error.h"

namespace kproxy::ipvs {

/// What `ipset save` says: each set's create line and its entries ("10.96.0.10,tcp:80").
struct IpsetState {
  struct Set {
    std::string createLine;  ///< as saved, with the kernel's extra settings
    std::set<std::string> entries;
  };
  std::map<std::string, Set> sets;
};

/// Parses `ipset save` output ("create NAME TYPE ..." and "add NAME ENTRY" lines; others are
/// ignored). An "add" for a set not created before it is an error (kDecode).
core::Result<IpsetState> parseIpsetSave(std::string_view text);

class KernelIpsets {
 public:
  virtual ~KernelIpsets() = default;
  /// `ipset save`: every set of the namespace.
  virtual core::Result<IpsetState> save() = 0;
  /// `ipset restore -exist` of `input` ("create ...", "add ...", "del ...", "destroy ..." lines).
  /// A refusal is an error of category kKernel quoting what the tool said.
  virtual core::Result<void> restore(std::string_view input) = 0;
  virtual std::string describe() const = 0;
};

/// The ipset program found in PATH or sbin, run through `runner`. Error when it is missing.
core::Result<std::unique_ptr<KernelIpsets>> makeProcessIpsets(backends::ProcessRunner& runner);

/// In memory: restore lines applied in order with `-exist`'s meaning; an unknown set in "add",
/// "del" or "destroy" is refused as the tool refuses it, and nothing of that input is kept.
class FakeIpsets final : public KernelIpsets {
 public:
  core::Result<IpsetState> save() override;
  core::Result<void> restore(std::string_view input) override;
  std::string describe() const override { return "fake ipset"; }

  IpsetState state;
  std::vector<std::string> restores;  ///< every input, in order
  bool refuseNext = false;            ///< refuse the next restore
};

}  // namespace kproxy::ipvs
