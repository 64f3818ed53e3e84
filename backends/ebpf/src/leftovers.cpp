// cleanUpEbpfLeftovers (leftovers.h).
#include "kproxy/ebpf/leftovers.h"

#include "kproxy/core/log.h"
#include "kproxy/nftables/leftovers.h"

namespace kproxy::ebpf {

bool cleanUpEbpfLeftovers(backends::LeftoverSystem& system, const std::string& pinPath) {
  bool ok = true;
  // The pins first: the tables serve only traffic from other hosts, the programs every local
  // socket of the cgroup.
  auto removed = system.removeBpfPins(pinPath);
  if (!removed) {
    log::error("removing ebpf mode's pins failed", {{"path", pinPath}, {"error", removed.error().message()}});
    ok = false;
  } else if (*removed) {
    log::info(0, "removed ebpf leftovers: programs detached, pins removed", {{"path", pinPath}});
  }
  return nftables::cleanUpNftablesLeftovers(system, kNftablesTable) && ok;
}

}  // namespace kproxy::ebpf
