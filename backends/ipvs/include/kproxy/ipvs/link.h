#pragma once
/// KernelDummyLink: the dummy interface (kube-ipvs0) that IPVS mode binds every service address
/// to, so that the node accepts packets for them and IPVS sees them at INPUT. Like kube-proxy,
/// kproxy creates it and leaves it down: the kernel still adds a local route for each address
/// of a down link (IPv4, and IPv6 on the kernels tested, 6.1). Addresses are host prefixes (/32, /128) of scope global, as
/// kube-proxy binds them. The rtnetlink implementation (libnl-route-3) sits beside a fake.
/// Thread-safety: an adapter is not thread-safe; one owner uses it.

#include <memory>
#include <string>
#include <vector>

#include "kproxy/backends/common/address.h"
#include "kproxy/core/error.h"

namespace kproxy::ipvs {

/// The interface name kube-proxy uses and runbooks look for.
inline constexpr const char* kDummyLinkName = "kube-ipvs0";

class KernelDummyLink {
 public:
  virtual ~KernelDummyLink() = default;

  /// Creates dummy link `name` unless it exists. Returns whether it existed. An existing link
  /// of another type is an error (EEXIST): kproxy never takes over someone else's interface.
  virtual core::Result<bool> ensureLink(const std::string& name) = 0;
  /// Deletes dummy link `name` with its addresses; a missing link is not an error, a link of
  /// another type is (EINVAL, left alone).
  virtual core::Result<void> deleteLink(const std::string& name) = 0;
  /// The addresses on `name` (both families, without link-local IPv6 ones), as host prefixes.
  /// ENODEV when the link is missing.
  virtual core::Result<std::vector<backends::IPPrefix>> listAddresses(const std::string& name) = 0;
  /// Binds `address` (a host address) to `name`. EEXIST when it is bound already; ENODEV
  /// when the link is missing.
  virtual core::Result<void> addAddress(const std::string& name, const backends::IPPrefix& address) = 0;
  /// Unbinds `address` from `name`. EADDRNOTAVAIL when it is not bound; ENODEV when the link
  /// is missing.
  virtual core::Result<void> deleteAddress(const std::string& name,
                                           const backends::IPPrefix& address) = 0;
};

/// The real kernel over one NETLINK_ROUTE socket (libnl-route-3), in the calling thread's
/// network namespace when made.
core::Result<std::unique_ptr<KernelDummyLink>> makeNetlinkDummyLink();

/// In-memory links with the kernel's refusals.
class FakeDummyLink : public KernelDummyLink {
 public:
  struct FakeLink {
    std::string kind = "dummy";
    std::vector<backends::IPPrefix> addresses;
  };

  core::Result<bool> ensureLink(const std::string& name) override;
  core::Result<void> deleteLink(const std::string& name) override;
  core::Result<std::vector<backends::IPPrefix>> listAddresses(const std::string& name) override;
  core::Result<void> addAddress(const std::string& name, const backends::IPPrefix& address) override;
  core::Result<void> deleteAddress(const std::string& name,
                                   const backends::IPPrefix& address) override;

  std::vector<std::pair<std::string, FakeLink>> links;  ///< name → link, in creation order

 private:
  FakeLink* find(const std::string& name);
};

/// The error for `errnum` returned for `what` ("add address 10.0.0.1 to kube-ipvs0"): ENODEV,
/// EEXIST, EADDRNOTAVAIL named. Shared by the adapter and the fake.
core::Error linkError(const std::string& what, int errnum);

}  // namespace kproxy::ipvs
