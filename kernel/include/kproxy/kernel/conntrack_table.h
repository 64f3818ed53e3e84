#pragma once
/// The kernel's connection tracking table, as much of it as stale-entry cleanup needs: list the
/// flows of one protocol in one family, delete one flow. The real implementation speaks
/// ctnetlink over libmnl; FakeConntrackTable keeps flows in memory for tests.
/// Not thread-safe: one owner.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/core/model.h"

namespace kproxy::kernel {

/// One direction of a flow. Addresses are canonical text (inet_ntop form).
struct ConntrackTuple {
  std::string srcIP;
  std::string dstIP;
  std::uint16_t srcPort = 0;
  std::uint16_t dstPort = 0;
  bool operator==(const ConntrackTuple&) const = default;
};

/// A conntrack entry. `original` is what the client sent (destination: the service address);
/// `reply` is what the kernel expects back (source: the endpoint after DNAT).
struct ConntrackFlow {
  net::Family family = net::Family::kIPv4;
  core::Protocol protocol = core::Protocol::kUDP;
  ConntrackTuple original;
  ConntrackTuple reply;
  std::uint16_t zone = 0;
  /// "udp 10.0.0.1:40000->172.30.0.10:53 reply 10.1.0.2:53->10.0.0.1:40000", for logs.
  std::string str() const;
  bool operator==(const ConntrackFlow&) const = default;
};

class ConntrackTable {
 public:
  virtual ~ConntrackTable() = default;
  /// Every flow of `protocol` in `family` (TCP, UDP or SCTP).
  virtual core::Result<std::vector<ConntrackFlow>> list(net::Family family,
                                                         core::Protocol protocol) = 0;
  /// Deletes the given flows (matched by original tuple, protocol and zone). A flow that is
  /// already gone is not an error. Returns how many the table really deleted.
  virtual core::Result<std::size_t> remove(const std::vector<ConntrackFlow>& flows) = 0;
};

/// ctnetlink (NETLINK_NETFILTER, IPCTNL_MSG_CT_GET dump / IPCTNL_MSG_CT_DELETE) in the calling
/// thread's network namespace. The socket is opened on first use.
std::unique_ptr<ConntrackTable> makeNetlinkConntrackTable();

/// --dry-run's table: lists through `inner` (what the node really holds), prints each flow a
/// deletion would remove as the conntrack(8) command that would remove it, and deletes nothing
/// (it reports every flow as deleted).
class PrintingConntrackTable final : public ConntrackTable {
 public:
  PrintingConntrackTable(std::unique_ptr<ConntrackTable> inner, std::FILE* out)
      : inner_(std::move(inner)), out_(out) {}
  core::Result<std::vector<ConntrackFlow>> list(net::Family family, core::Protocol protocol) override {
    return inner_->list(family, protocol);
  }
  core::Result<std::size_t> remove(const std::vector<ConntrackFlow>& flows) override;

 private:
  std::unique_ptr<ConntrackTable> inner_;
  std::FILE* out_;
};

/// In-memory table for tests: holds flows, records what was deleted, can be told to fail.
class FakeConntrackTable final : public ConntrackTable {
 public:
  core::Result<std::vector<ConntrackFlow>> list(net::Family family,
                                                core::Protocol protocol) override;
  core::Result<std::size_t> remove(const std::vector<ConntrackFlow>& flows) override;

  std::vector<ConntrackFlow> flows;    ///< what the table holds
  std::vector<ConntrackFlow> removed;  ///< every flow remove() deleted, in order
  int listCalls = 0;
  bool failList = false;
  bool failRemove = false;
};

}  // namespace kproxy::kernel
