#include "leftover_cleanup.h"

#include "kproxy/iptables/leftovers.h"
#include "kproxy/ipvs/leftovers.h"

namespace kproxy::cli {

bool cleanUpKubeProxyLeftovers(backends::LeftoverSystem& system) {
  bool ok = ipvs::cleanUpIpvsLeftovers(system);
  ok = ipvs::cleanUpDummyInterfaceLeftover(system) && ok;
  ok = iptables::cleanUpIptablesLeftovers(system) && ok;
  ok = ipvs::cleanUpIpsetLeftovers(system) && ok;
  return ok;
}

}  // namespace kproxy::cli
