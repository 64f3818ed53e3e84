#include "proxy_config.h"

#include "net_util.h"

#include "kproxy/core/nodeport_addresses.h"

namespace kproxy::cli {

Duration ProxyConfig::effectiveSyncPeriod() const {
  if (mode == "ipvs") return ipvs.syncPeriod;
  if (mode == "nftables") return nftables.syncPeriod;
  return iptables.syncPeriod;
}

Duration ProxyConfig::effectiveMinSyncPeriod() const {
  if (mode == "ipvs") return ipvs.minSyncPeriod;
  if (mode == "nftables") return nftables.minSyncPeriod;
  return iptables.minSyncPeriod;
}

void applyPlatformDefaults(ProxyConfig& config) {
  if (config.mode.empty()) config.mode = kDefaultProxyMode;
  if (config.detectLocalMode.empty()) config.detectLocalMode = "ClusterCIDR";
  if (config.nodePortAddresses.empty())
    config.nodePortAddresses = kproxy::core::defaultNodePortAddresses(config.mode);
}

std::string appendPortIfNeeded(const std::string& address, std::int32_t port) {
  if (address.empty() || splitHostPort(address)) return address;
  if (!ipFamilyOf(address)) return address;
  return net::joinHostPort(address, std::to_string(port));
}

}  // namespace kproxy::cli
