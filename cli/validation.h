#pragma once
/// Checks of the effective configuration, after upstream's validation.go. Each problem is one
/// line naming the field (and its flag, when it has one) and the bad value, e.g.
///   invalid iptables.syncPeriod "0s" (flag --iptables-sync-period): must be greater than 0
///   unknown proxy mode "foo"; available: iptables, nftables

#include <span>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "proxy_config.h"

namespace kproxy::cli {

/// Every problem found, in a stable order; empty when `config` is valid. `availableModes` are
/// the proxy modes the caller can run (the names of the loaded backend plugins). Feature gates
/// are checked against upstream v1.34's (feature_gates.h).
std::vector<std::string> validationErrors(const ProxyConfig& config,
                                          std::span<const std::string> availableModes);

/// The first of validationErrors() as an kInvalidArgument error, or success.
core::Result<void> validate(const ProxyConfig& config, std::span<const std::string> availableModes);

/// What upstream's checkBadConfig logs about a valid `config.nodePortAddresses` that leaves
/// NodePorts open on every local address of a family: unset, or CIDRs of one family only
/// while the configuration is dual-stack (clusterCIDR or ipvs.excludeCIDRs of both families).
/// One line each; empty when nothing is worth saying.
std::vector<std::string> nodePortAddressWarnings(const ProxyConfig& config);

}  // namespace kproxy::cli
