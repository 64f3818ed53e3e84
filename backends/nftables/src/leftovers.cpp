#include "kproxy/nftables/leftovers.h"

#include <cerrno>
#include <string>

#include "kproxy/core/log.h"

namespace kproxy::nftables {

bool cleanUpNftablesLeftovers(backends::LeftoverSystem& system, std::string_view tableName) {
  bool ok = true;
  for (std::string_view family : {"ip", "ip6"}) {
    const std::string table = std::string(family) + " " + std::string(tableName);
    auto deleted = system.deleteNftablesTable(family, tableName);
    if (!deleted) {
      const int e = deleted.error().errnum;
      if (e == EPROTONOSUPPORT || e == EAFNOSUPPORT || e == EOPNOTSUPP) {
        // As upstream, where knftables cannot be set up: no nftables here, so nothing to remove.
        log::info(2, "nftables not available; nftables leftovers not looked for",
                  {{"error", deleted.error().message()}});
        return true;
      }
      log::error("deleting nftables table failed", {{"table", table}, {"error", deleted.error().message()}});
      ok = false;
      continue;
    }
    if (*deleted) log::info(0, "removed nftables leftovers", {{"table", table}});
  }
  return ok;
}

}  // namespace kproxy::nftables
