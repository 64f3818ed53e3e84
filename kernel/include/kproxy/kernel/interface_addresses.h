#pragma once
/// The node's own interface addresses over rtnetlink: a one-off read (RTM_GETADDR dump of both
/// families) and a watcher that follows changes (RTMGRP_IPV4_IFADDR / RTMGRP_IPV6_IFADDR) and
/// reports the whole list again after a quiet period, so a burst of changes (an interface
/// coming up with several addresses) is one report. Upstream reads the same list through Go's
/// net.InterfaceAddrs for --nodeport-addresses.
///
/// Sockets belong to the network namespace of the thread that opens them: both are opened by
/// the caller of read / start.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::kernel {

/// `excludedInterface` names an interface whose addresses are not the node's (IPVS mode's
/// kube-ipvs0, which holds the Services' addresses; empty: none): its addresses are left out
/// (upstream's GetAllLocalAddressesExcept("kube-ipvs0")), and its changes are not reported
/// either: binding a new Service's ClusterIP is no node address change.

/// Every address of every interface but `excludedInterface`, both families, numeric
/// ("10.0.0.1", "fd00::1"), sorted and unique. The local address of a point-to-point link, not
/// its peer.
core::Result<std::vector<std::string>> readInterfaceAddresses(std::string_view excludedInterface);

/// Follows the interface addresses of the caller's network namespace on a thread of its own.
/// Destroying it stops the thread. The callback runs on that thread.
class InterfaceAddressWatcher {
 public:
  using Callback = std::function<void(std::vector<std::string> addresses)>;

  /// Subscribes, reads the addresses once and hands them to `onChange` before returning (so
  /// no change between the read and the subscription is lost), then reports each later change
  /// once no further change came for `quiet`. Fails when either socket or the first read
  /// fails. A later failed read is logged and retried at the next change or after `quiet`.
  static core::Result<std::unique_ptr<InterfaceAddressWatcher>> start(
      std::string excludedInterface, Callback onChange,
      std::chrono::milliseconds quiet = std::chrono::milliseconds(200));

  ~InterfaceAddressWatcher();
  InterfaceAddressWatcher(const InterfaceAddressWatcher&) = delete;
  InterfaceAddressWatcher& operator=(const InterfaceAddressWatcher&) = delete;

  struct Impl;

 private:
  explicit InterfaceAddressWatcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::kernel
