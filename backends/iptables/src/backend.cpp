// The backend around the differ: its full and partial passes and the canary, applying restore
// input and netlink transactions, route_localnet, cleanup and metrics.
#include "kproxy/iptables/backend.h"

#include <linux/netlink.h>

#include <cerrno>

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/backends/common/iptables_save.h"
#include "kproxy/iptables/explain.h"
#include "kproxy/iptables/kernel_netlink.h"
#include "tool_errors.h"

namespace kproxy::iptables {
namespace {

constexpr net::Family kFamilies[] = {net::Family::kIPv4, net::Family::kIPv6};

}  // namespace

IptablesBackend::IptablesBackend(sdk::Host host, BackendSettings settings, std::unique_ptr<KernelIptables> kernel,
                                 std::unique_ptr<kernel::Sysctls> sysctls)
    : Reconciler(host, backends::kernelReconcilerOptions("iptables", settings.dryRun, settings.dryRunOutput)),
      host_(host),
      settings_(std::move(settings)),
      renderer_(settings_.render),
      kernel_(std::move(kernel)),
      sysctls_(std::move(sysctls)) {}

std::size_t IptablesBackend::mirroredChains(net::Family family) const {
  const auto& m = mirror_[index(family)];
  return m.chains[0].size() + m.chains[1].size() + m.chains[2].size();
}

bool IptablesBackend::kernelChangedOutside(const std::vector<sdk::ChangedKey>& changed) {
  // Checked on periodic syncs only (nothing changed): each check runs the tool, once per family.
  if (!changed.empty()) return false;
  bool flushed = false;
  for (net::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    auto exists = kernel_->chainExists(fam, Table::kMangle, backends::iptables_chains::kProxyCanary);
    if (!exists) {
      host_.warning(fmt::format("iptables: checking the canary chain: {}", exists.error().message()));
    } else if (!*exists) {
      host_.info(0, fmt::format("iptables: the {} mangle table lost KUBE-PROXY-CANARY (flushed?); syncing in full",
                                toolName(fam)));
      flushed = true;
    }
  }
  return flushed;
}

void IptablesBackend::beginPass(const plan::SnapshotSource& next, bool full) {
  kernel_->takeToolTimes();  // what a failed sync's tools cost is not this sync's
  netlinkRules_ = netlinkCommits_ = 0;
  touched_.clear();
  const sdk::NodeInfo node = next.node();
  renderer_.setNode(node);
  renderer_.setServiceCIDRs(next.serviceCIDRs());
  if (full) {
    // Upstream leaves per-endpoint comments out above 1,000 endpoints; decided per full sync
    // here, so that partial syncs never rewrite unrelated chains.
    std::size_t endpoints = 0;
    next.forEach([&](const sdk::ServicePort& p) { endpoints += p.allEndpoints.size(); });
    renderer_.setLargeCluster(endpoints > settings_.render.largeClusterEndpoints);
    recentLists_ = 0;
    ensureNfacct();
  }
}

void IptablesBackend::ensureNfacct() {
  if (!nfacct_) return;
  NfacctObjects objects;
  for (auto [name, exists] : {std::pair{backends::kNfacctInvalidDropped, &objects.invalidDropped},
                              std::pair{backends::kNfacctLocalhostNodePorts, &objects.localhostNodePorts}}) {
    auto ensured = nfacct_->ensure(std::string(name));
    *exists = ensured.has_value();
    if (!ensured)
      host_.error(fmt::format("Failed to create nfacct counter; the corresponding metric will not be updated "
                              "counter=\"{}\" error=\"{}\"",
                              name, ensured.error().message()));
  }
  renderer_.setNfacct(objects);
}

sdk::Expected<backends::PassOutcome> IptablesBackend::fullSync(const plan::SnapshotSource& next) {
  beginPass(next, true);
  std::size_t operations = 0;
  for (net::Family fam : kFamilies) {
    lastRestore_[index(fam)].clear();
    if (!familyEnabled(fam)) continue;
    // The old mirror is not read again (a failure leaves the next sync full, and it reads the
    // kernel anew): freed first, it is never resident beside the new one (about 10 MB at
    // 10,000 Services). Its rule counts stay for the metrics until then.
    {
      FamilyMirror& old = mirror_[index(fam)];
      FamilyMirror counted;
      std::copy(std::begin(old.rules), std::end(old.rules), std::begin(counted.rules));
      std::copy(std::begin(old.written), std::end(old.written), std::begin(counted.written));
      old = std::move(counted);
    }
    FamilyMirror fresh;
    std::string input;
    if (auto r = fullSyncFamily(next, fam, fresh, input, operations); !r) return std::unexpected(r.error());
    mirror_[index(fam)] = std::move(fresh);
    if (input.size() > settings_.lastRestoreKept) input.clear();
    lastRestore_[index(fam)] = std::move(input);
  }
  warnAboutRecentLists();
  setRouteLocalnet();
  updateMetrics();
  return passOutcome(true, operations);
}

sdk::Expected<backends::PassOutcome> IptablesBackend::partialSync(const plan::SnapshotSource& next,
                                                                  const std::vector<sdk::ChangedKey>& changed) {
  beginPass(next, false);
  std::size_t operations = 0;
  for (net::Family fam : kFamilies) {
    lastRestore_[index(fam)].clear();
    if (!familyEnabled(fam)) continue;
    std::vector<std::string> keys;
    for (const auto& c : changed)
      if (c.family == fam) keys.push_back(c.key);
    RestoreEdit edit;
    edit.keepNat = netlinkAllowed();
    partialSyncFamily(next, fam, keys, mirror_[index(fam)], edit, operations);
    std::string input = edit.text();
    // A refusal leaves the next sync full: the mirror now describes what was refused.
    if (auto r = applyPartial(fam, edit, input); !r) return std::unexpected(r.error());
    FamilyMirror& mirror = mirror_[index(fam)];
    std::copy(std::begin(edit.written), std::end(edit.written), std::begin(mirror.written));
    if (input.size() > settings_.lastRestoreKept) input.clear();
    lastRestore_[index(fam)] = std::move(input);
  }
  updateMetrics();
  return passOutcome(false, operations);
}

backends::PassOutcome IptablesBackend::passOutcome(bool full, std::size_t operations) {
  backends::PassOutcome out;
  out.operations = operations;
  out.detail = fmt::format("kernel={}", kernel_->describe());
  // Where the time went: the tools' own CPU, in user space (parsing, their cache of the table)
  // and in the kernel (for iptables-nft, applying and validating each commit).
  if (netlinkCommits_ > 0)
    out.detail += fmt::format(" netlink_rules={} netlink_commits={}", netlinkRules_, netlinkCommits_);
  if (const auto tools = kernel_->takeToolTimes(); tools.runs > 0)
    out.detail += fmt::format(" tool_runs={} tool_user_ms={:.1f} tool_kernel_ms={:.1f}", tools.runs,
                              tools.user.count() / 1000.0, tools.system.count() / 1000.0);
  // A full pass that still wrote something: the kernel differed from the plan (a
  // self-verification, or a first sync). Name the first of them.
  if (full && operations > 0 && !touched_.empty())
    out.detail += fmt::format(" first changes: {}", fmt::join(touched_, "; "));
  return out;
}

sdk::Expected<void> IptablesBackend::apply(net::Family family, const std::string& input) {
  if (input.empty()) return {};
  auto r = kernel_->restore(family, input);
  if (!r) return restoreFailed(family, r.error());
  return {};
}

sdk::Expected<void> IptablesBackend::restoreFailed(net::Family family, const core::Error& e) {
  if (metrics_.restoreFailures.active()) metrics_.restoreFailures.add({std::string(familyName(family))}, 1);
  return failed(e, std::string(toolName(family)) + "-restore");
}

sdk::Expected<void> IptablesBackend::netlinkFailed(net::Family family, const core::Error& e) {
  if (metrics_.restoreFailures.active()) metrics_.restoreFailures.add({std::string(familyName(family))}, 1);
  // A refusal of what was encoded (an invalid or unsupported expression) would come again:
  // every later sync uses the tool. Others (a chain someone's rule still jumps to, a table
  // flushed meanwhile, no memory) are the state's, and the full sync that follows retries.
  const bool encoding = e.errnum == EINVAL || e.errnum == EOPNOTSUPP || e.errnum == EPROTONOSUPPORT ||
                        e.errnum == EAFNOSUPPORT || e.errnum == ERANGE;
  if (encoding) netlinkRefused_ = true;
  return failed(e, encoding ? "nat chains over netlink (every later sync writes them with " +
                                  std::string(toolName(family)) + "-restore)"
                            : std::string("nat chains over netlink"));
}

core::Result<void> IptablesBackend::commitOverNetlink(NftRuleBatch& batch) {
  auto socket = kernel::keptSocket(netlinkSocket_, NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  auto r = batch.commit(**socket);
  if (!r) netlinkSocket_.reset();  // whatever the socket holds after a failure, the next one starts clean
  return r;
}

sdk::Expected<void> IptablesBackend::applyPartial(net::Family family, const RestoreEdit& edit, const std::string& input) {
  if (!edit.natChainsOnly()) return apply(family, input);
  // Only whole nat chains change (an endpoint added, removed or changed): one netlink
  // transaction, without the tool's start and its fetch of the table.
  NftRuleBatch batch(family);
  std::vector<NftChainRewrite> chains;
  chains.reserve(edit.natRewrites.size());
  for (const auto& [name, rules] : edit.natRewrites) chains.push_back({name, rules});
  if (auto added = batch.add(chains); !added) {
    host_.warning(fmt::format("iptables: {}; restoring the change with {}-restore", added.error().message(),
                              toolName(family)));
    return apply(family, input);
  }
  std::vector<std::string_view> drops(edit.natDrops.begin(), edit.natDrops.end());
  batch.remove(drops);
  const std::size_t rules = batch.rules();
  if (auto r = commitOverNetlink(batch); !r) return netlinkFailed(family, r.error());
  netlinkRules_ += rules;
  ++netlinkCommits_;
  return {};
}

void IptablesBackend::warnAboutRecentLists() {
  if (!kernel_->replacesWholeTables() || settings_.recentListsWarning == 0 ||
      recentLists_ < settings_.recentListsWarning) {
    recentWarned_ = false;
    return;
  }
  if (recentWarned_) return;
  recentWarned_ = true;
  host_.warning(fmt::format(
      "iptables: {} session-affinity lists (-m recent) with {}: every change replaces the whole nat table, "
      "and the kernel looks each list up by a linear search when it does, so changes grow with the square "
      "of the lists (over two minutes per change at 30,000 measured); iptables-nft or --proxy-mode=nftables "
      "do not pay this per change",
      recentLists_, kernel_->describe()));
}

void IptablesBackend::setRouteLocalnet() {
  // Localhost NodePorts (IPv4) need the kernel to route packets from 127.0.0.0/8, as upstream
  // sets when --iptables-localhost-nodeports is on and NodePorts answer on loopback.
  if (!renderer_.localhostNodePorts()) return;
  const char* name = "net/ipv4/conf/all/route_localnet";
  if (auto v = sysctls_->readInt(name); v && *v == 1) return;
  if (auto w = sysctls_->writeInt(name, 1); !w)
    host_.warning(fmt::format("iptables: setting {}=1 for localhost NodePorts: {}", name, w.error().message()));
  else
    host_.info(1, fmt::format("iptables: set {}=1 for localhost NodePorts", name));
}

sdk::Expected<void> IptablesBackend::cleanup() {
  requireFullSync();
  for (auto& m : mirror_) m = FamilyMirror{};
  for (net::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    RestoreEdit edit;
    std::set<std::string> owned[3];
    std::vector<backends::IptablesTable> tables;
    for (Table t : kTables) {
      auto text = kernel_->save(fam, t);
      if (!text) return failed(text.error(), fmt::format("{}-save -t {}", toolName(fam), tableName(t)));
      auto parsed = backends::parseIptablesSave(*text);
      if (!parsed) return failed(parsed.error(), "reading iptables-save");
      for (auto& table : parsed->tables) tables.push_back(std::move(table));
    }
    for (const auto& table : tables) {
      const std::optional<Table> named = tableNamed(table.name);
      if (!named) continue;  // only filter, nat and mangle were saved
      const Table t = *named;
      for (const auto& c : table.chains)
        if (!c.builtin() && isOwnedChain(t, c.name)) owned[index(t)].insert(c.name);
      // Jumps into kproxy's chains from chains that stay (the built-in ones).
      for (const auto& c : table.chains) {
        if (owned[index(t)].contains(c.name)) continue;
        for (const auto& r : c.rules)
          if (owned[index(t)].contains(backends::ruleJumpTarget(r.spec)))
            edit.deleteRule(t, c.name, r.spec);
      }
      for (const auto& name : owned[index(t)]) edit.drop(t, name);
    }
    std::string input = edit.text();
    if (input.empty()) continue;
    if (auto r = apply(fam, input); !r) return r;
    host_.info(1, fmt::format("iptables cleanup: removed kproxy's chains ({})", toolName(fam)));
  }
  return {};
}

sdk::Expected<std::string> IptablesBackend::explain(const sdk::SnapshotView& snapshot,
                                                    const sdk::ExplainRequest& request) {
  const std::vector<sdk::ServicePort> ports = snapshot.all();
  const std::vector<sdk::ServiceCIDR> cidrs = snapshot.serviceCIDRs();
  // The rules as a full sync renders them: counting into both nfacct objects when there is
  // nfacct (a full sync ensures them), into none otherwise.
  const bool counts = nfacct_ != nullptr;
  return explainPacket(settings_.render, ports, snapshot.node(), request, cidrs, NfacctObjects{counts, counts});
}

sdk::Expected<IptablesBackend::Metrics> IptablesBackend::registerMetrics(const sdk::Host& host) {
  Metrics m;
  auto rules = host.gauge("kproxy_iptables_rules", "Rules in kproxy's iptables chains after the last sync",
                          {"family", "table"});
  if (!rules) return std::unexpected(rules.error());
  m.rules = *rules;
  // The host serves these two as upstream's kubeproxy_sync_proxy_rules_iptables_total / _last.
  auto written = host.gauge("kproxy_iptables_rules_last_sync",
                            "Rules kproxy's last sync wrote to its iptables chains (rewritten chains' rules and "
                            "inserted rules)",
                            {"family", "table"});
  if (!written) return std::unexpected(written.error());
  m.lastSync = *written;
  auto failures = host.counter("kproxy_iptables_restore_failures_total",
                               "iptables-restore runs that the tool refused", {"family"});
  if (!failures) return std::unexpected(failures.error());
  m.restoreFailures = *failures;
  return m;
}

void IptablesBackend::updateMetrics() const {
  if (!metrics_.rules.active()) return;
  for (net::Family fam : kFamilies) {
    if (!familyEnabled(fam)) continue;
    const auto& m = mirror_[index(fam)];
    for (Table t : kTables) {
      const std::vector<std::string> labels{std::string(familyName(fam)), std::string(tableName(t))};
      metrics_.rules.set(labels, static_cast<double>(m.rules[index(t)]));
      metrics_.lastSync.set(labels, static_cast<double>(m.written[index(t)]));
    }
  }
}

}  // namespace kproxy::iptables
