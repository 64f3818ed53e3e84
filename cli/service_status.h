#pragma once
/// Per-service status: what each service port means on this node and where its programming
/// stands. Served as JSON by the metrics server's /debug/services and printed by `kproxy
/// status`. Computed from the last applied snapshot, the shared service plan (the same decisions
/// every backend renders) and the sync loop's ledger, so it reads the same in every mode.
///
/// Thread-safety: pure functions of their inputs.

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kproxy/core/proxier.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/plan/options.h"
#include "kproxy/plan/service_plan.h"

namespace kproxy::cli {

struct ServiceStatusInput {
  std::string mode;
  std::shared_ptr<const core::Snapshot> snapshot;  ///< the last applied one; null before any
  core::SyncLedger ledger;
  /// The options every backend gets, parsed as every backend parses them: the plan's
  /// node-wide settings (plan::planConfigOf), with the node's part from the snapshot
  /// (plan::applyNode), and where NodePorts answer (plan::nodePortAddressesOf).
  plan::CommonOptions common;
  double nowWall = 0;
  /// Only this service ("namespace/name"), when not empty.
  std::string service;
};

/// The /debug/services document: the mode, the node, the last syncs, and one entry per service
/// port (sorted by service, port, family) with its addresses, what internal and external
/// traffic meets, every endpoint with the reason it is used or not, when and by which sync it
/// was last programmed (with that sync's kernel operations) and the last error.
nlohmann::json servicesStatus(const ServiceStatusInput& input);

/// The document as a table for a person (`kproxy status`): one row per service port, then the
/// endpoints of each port whose endpoints are not all in use, and the errors.
std::string servicesStatusTable(const nlohmann::json& status, bool wide);

}  // namespace kproxy::cli
