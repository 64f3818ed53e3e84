// KernelDummyLink over rtnetlink (libnl-route-3).
#include "kproxy/ipvs/link.h"

#include <net/if.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <netlink/addr.h>
#include <netlink/cache.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/socket.h>

#include "libnl_errors.h"

namespace kproxy::ipvs {

core::Error linkError(const std::string& what, int errnum) {
  std::string meaning;
  auto category = core::ErrorCategory::kKernel;
  switch (errnum) {
    case ENODEV:
      meaning = "no such link";
      category = core::ErrorCategory::kNotFound;
      break;
    case EEXIST: meaning = "exists"; break;
    case EADDRNOTAVAIL:
      meaning = "address not bound";
      category = core::ErrorCategory::kNotFound;
      break;
    case EINTR:
    case EAGAIN:
    case ENOBUFS:
    case ENOMEM: category = core::ErrorCategory::kTransient; break;
    default: break;
  }
  std::string context = "ipvs: " + what;
  if (!meaning.empty()) context += ": " + meaning;
  return core::Error{category, errnum, std::move(context)};
}

namespace {

struct SocketDeleter {
  void operator()(nl_sock* sock) const { nl_socket_free(sock); }
};
struct LinkDeleter {
  void operator()(rtnl_link* link) const { rtnl_link_put(link); }
};
struct AddrDeleter {
  void operator()(rtnl_addr* addr) const { rtnl_addr_put(addr); }
};
struct NlAddrDeleter {
  void operator()(nl_addr* addr) const { nl_addr_put(addr); }
};
struct CacheDeleter {
  void operator()(nl_cache* cache) const { nl_cache_free(cache); }
};
using Socket = std::unique_ptr<nl_sock, SocketDeleter>;
using Link = std::unique_ptr<rtnl_link, LinkDeleter>;

int captureErrno(sockaddr_nl*, nlmsgerr* err, void* arg) {
  *static_cast<int*>(arg) = -err->error;
  return NL_STOP;
}

bool isLinkLocal6(const backends::IPPrefix& a) { return a.v6 && a.bytes[0] == 0xfe && (a.bytes[1] & 0xc0) == 0x80; }

class NetlinkDummyLink final : public KernelDummyLink {
 public:
  explicit NetlinkDummyLink(Socket sock) : sock_(std::move(sock)) {
    nl_socket_modify_err_cb(sock_.get(), NL_CB_CUSTOM, captureErrno, &kernelErrno_);
  }

  core::Result<bool> ensureLink(const std::string& name) override {
    auto existing = get(name);
    if (!existing) return std::unexpected(existing.error());
    if (*existing) {
      if (auto r = requireDummy(existing->get(), name, EEXIST); !r) return std::unexpected(r.error());
      return true;
    }
    Link link(rtnl_link_alloc());
    if (!link) return std::unexpected(linkError("create link " + name, ENOMEM));
    rtnl_link_set_name(link.get(), name.c_str());
    if (int rc = rtnl_link_set_type(link.get(), "dummy"); rc < 0)
      return std::unexpected(linkError("create link " + name + ": libnl has no dummy link type", errnoFromLibnl(rc)));
    kernelErrno_ = 0;
    if (int rc = rtnl_link_add(sock_.get(), link.get(), NLM_F_CREATE | NLM_F_EXCL); rc < 0) {
      const int errnum = kernelErrno_ != 0 ? kernelErrno_ : errnoFromLibnl(rc);
      if (errnum == EEXIST) return ensureLink(name);  // created meanwhile by someone else
      if (errnum == EOPNOTSUPP)
        return std::unexpected(linkError("create dummy link " + name + " (is the dummy module missing?)", errnum));
      return std::unexpected(linkError("create dummy link " + name, errnum));
    }
    return false;
  }

  core::Result<void> deleteLink(const std::string& name) override {
    auto existing = get(name);
    if (!existing) return std::unexpected(existing.error());
    if (!*existing) return {};
    if (auto r = requireDummy(existing->get(), name, EINVAL); !r) return r;
    kernelErrno_ = 0;
    if (int rc = rtnl_link_delete(sock_.get(), existing->get()); rc < 0) {
      const int errnum = kernelErrno_ != 0 ? kernelErrno_ : errnoFromLibnl(rc);
      if (errnum == ENODEV) return {};
      return std::unexpected(linkError("delete link " + name, errnum));
    }
    return {};
  }

  core::Result<std::vector<backends::IPPrefix>> listAddresses(const std::string& name) override {
    auto ifindex = indexOf(name, "list addresses of " + name);
    if (!ifindex) return std::unexpected(ifindex.error());
    nl_cache* raw = nullptr;
    kernelErrno_ = 0;
    if (int rc = rtnl_addr_alloc_cache(sock_.get(), &raw); rc < 0)
      return std::unexpected(
          linkError("list addresses of " + name, kernelErrno_ != 0 ? kernelErrno_ : errnoFromLibnl(rc)));
    std::unique_ptr<nl_cache, CacheDeleter> cache(raw);
    std::vector<backends::IPPrefix> out;
    for (nl_object* obj = nl_cache_get_first(cache.get()); obj != nullptr; obj = nl_cache_get_next(obj)) {
      auto* addr = reinterpret_cast<rtnl_addr*>(obj);
      if (rtnl_addr_get_ifindex(addr) != *ifindex) continue;
      nl_addr* local = rtnl_addr_get_local(addr);
      if (local == nullptr) continue;
      backends::IPPrefix p;
      const int family = nl_addr_get_family(local);
      if (family != AF_INET && family != AF_INET6) continue;
      p.v6 = family == AF_INET6;
      p.length = p.v6 ? 128 : 32;
      if (nl_addr_get_len(local) != p.size()) continue;
      std::memcpy(p.bytes.data(), nl_addr_get_binary_addr(local), p.size());
      if (isLinkLocal6(p)) continue;
      out.push_back(p);
    }
    return out;
  }

  core::Result<void> addAddress(const std::string& name, const backends::IPPrefix& address) override {
    return changeAddress(name, address, true);
  }

  core::Result<void> deleteAddress(const std::string& name, const backends::IPPrefix& address) override {
    return changeAddress(name, address, false);
  }

 private:
  /// The link named `name`, or null when there is none.
  core::Result<Link> get(const std::string& name) {
    rtnl_link* raw = nullptr;
    kernelErrno_ = 0;
    int rc = rtnl_link_get_kernel(sock_.get(), 0, name.c_str(), &raw);
    if (rc >= 0) return Link(raw);
    const int errnum = kernelErrno_ != 0 ? kernelErrno_ : errnoFromLibnl(rc);
    if (errnum == ENODEV || rc == -NLE_OBJ_NOTFOUND || rc == -NLE_NODEV) return Link{};
    return std::unexpected(linkError("look up link " + name, errnum));
  }

  core::Result<int> indexOf(const std::string& name, const std::string& what) {
    auto link = get(name);
    if (!link) return std::unexpected(link.error());
    if (!*link) return std::unexpected(linkError(what, ENODEV));
    return rtnl_link_get_ifindex(link->get());
  }

  core::Result<void> requireDummy(rtnl_link* link, const std::string& name, int errnum) {
    const char* type = rtnl_link_get_type(link);
    if (type != nullptr && std::strcmp(type, "dummy") == 0) return {};
    return std::unexpected(linkError(
        fmt::format("link {} is of type '{}', not dummy; leaving it alone", name, type != nullptr ? type : "none"),
        errnum));
  }

  core::Result<void> changeAddress(const std::string& name, const backends::IPPrefix& address, bool add) {
    const std::string what = add ? fmt::format("add address {} to {}", address.toString(), name)
                                 : fmt::format("delete address {} from {}", address.toString(), name);
    auto ifindex = indexOf(name, what);
    if (!ifindex) return std::unexpected(ifindex.error());
    const int family = address.v6 ? AF_INET6 : AF_INET;
    std::unique_ptr<nl_addr, NlAddrDeleter> local(nl_addr_build(family, address.bytes.data(), address.size()));
    std::unique_ptr<rtnl_addr, AddrDeleter> addr(rtnl_addr_alloc());
    if (!local || !addr) return std::unexpected(linkError(what, ENOMEM));
    // A host prefix of scope global, as kube-proxy binds service addresses.
    nl_addr_set_prefixlen(local.get(), static_cast<int>(address.size() * 8));
    rtnl_addr_set_ifindex(addr.get(), *ifindex);
    rtnl_addr_set_family(addr.get(), family);
    if (int rc = rtnl_addr_set_local(addr.get(), local.get()); rc < 0)
      return std::unexpected(linkError(what, errnoFromLibnl(rc)));
    kernelErrno_ = 0;
    int rc = add ? rtnl_addr_add(sock_.get(), addr.get(), NLM_F_EXCL) : rtnl_addr_delete(sock_.get(), addr.get(), 0);
    if (rc < 0) return std::unexpected(linkError(what, kernelErrno_ != 0 ? kernelErrno_ : errnoFromLibnl(rc)));
    return {};
  }

  Socket sock_;
  int kernelErrno_ = 0;
};

}  // namespace

core::Result<std::unique_ptr<KernelDummyLink>> makeNetlinkDummyLink() {
  Socket sock(nl_socket_alloc());
  if (!sock) return std::unexpected(linkError("allocating a netlink socket", ENOMEM));
  if (int rc = nl_connect(sock.get(), NETLINK_ROUTE); rc < 0)
    return std::unexpected(linkError("connecting a NETLINK_ROUTE socket", errnoFromLibnl(rc)));
  nl_socket_enable_msg_peek(sock.get());
  return std::make_unique<NetlinkDummyLink>(std::move(sock));
}

}  // namespace kproxy::ipvs
