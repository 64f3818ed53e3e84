// KernelDummyLink over rtnetlink (libnl-route-3).
#include "kproxy/ipvs/kernel.h"

#include <linux/if_addr.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <netlink/addr.h>
#include <netlink/attr.h>
#include <netlink/msg.h>
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
using Socket = std::unique_ptr<nl_sock, SocketDeleter>;
using Link = std::unique_ptr<rtnl_link, LinkDeleter>;

struct CallbackDeleter {
  void operator()(nl_cb* cb) const { nl_cb_put(cb); }
};

/// The addresses of one link, collected from an RTM_GETADDR dump.
struct AddressDump {
  int ifindex = 0;
  std::vector<net::Prefix> addresses;
  bool interrupted = false;
};

bool isLinkLocal6(const net::Prefix& a) { return a.v6() && a.bytes[0] == 0xfe && (a.bytes[1] & 0xc0) == 0x80; }

int onAddress(nl_msg* msg, void* arg) {
  auto* dump = static_cast<AddressDump*>(arg);
  nlmsghdr* hdr = nlmsg_hdr(msg);
  if (hdr->nlmsg_type != RTM_NEWADDR) return NL_OK;
  std::array<nlattr*, IFA_MAX + 1> tb{};
  if (nlmsg_parse(hdr, sizeof(ifaddrmsg), tb.data(), IFA_MAX, nullptr) < 0) return NL_OK;
  const auto* ifa = static_cast<const ifaddrmsg*>(nlmsg_data(hdr));
  if (static_cast<int>(ifa->ifa_index) != dump->ifindex) return NL_OK;
  if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6) return NL_OK;
  // IFA_LOCAL is the address itself (IFA_ADDRESS is the peer on a point-to-point link); IPv6
  // sends IFA_ADDRESS alone.
  nlattr* attr = tb[IFA_LOCAL] != nullptr ? tb[IFA_LOCAL] : tb[IFA_ADDRESS];
  if (attr == nullptr) return NL_OK;
  net::Prefix p;
  p.family = ifa->ifa_family == AF_INET6 ? net::Family::kIPv6 : net::Family::kIPv4;
  p.length = p.v6() ? 128 : 32;
  if (nla_len(attr) != static_cast<int>(p.size())) return NL_OK;
  std::memcpy(p.bytes.data(), nla_data(attr), p.size());
  if (isLinkLocal6(p)) return NL_OK;
  // One address may be bound with several prefix lengths: report it once.
  if (std::find(dump->addresses.begin(), dump->addresses.end(), p) == dump->addresses.end())
    dump->addresses.push_back(p);
  return NL_OK;
}

int onInterrupted(nl_msg*, void* arg) {
  static_cast<AddressDump*>(arg)->interrupted = true;
  return NL_OK;
}

int captureErrno(sockaddr_nl*, nlmsgerr* err, void* arg) {
  *static_cast<int*>(arg) = -err->error;
  return NL_STOP;
}

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

  core::Result<std::vector<net::Prefix>> listAddresses(const std::string& name) override {
    const std::string what = "list addresses of " + name;
    auto ifindex = indexOf(name, what);
    if (!ifindex) return std::unexpected(ifindex.error());
    // Our own dump rather than libnl's address cache: the cache restarts an interrupted dump
    // without emptying itself, which reports addresses twice or ones already gone.
    for (int attempt = 0; attempt < 5; ++attempt) {
      AddressDump dump{*ifindex, {}, false};
      // A copy of the socket's callbacks (with the errno capture) plus the dump's own.
      std::unique_ptr<nl_cb, CallbackDeleter> base(nl_socket_get_cb(sock_.get()));
      std::unique_ptr<nl_cb, CallbackDeleter> cb(nl_cb_clone(base.get()));
      if (!cb) return std::unexpected(linkError(what, ENOMEM));
      nl_cb_set(cb.get(), NL_CB_VALID, NL_CB_CUSTOM, onAddress, &dump);
      nl_cb_set(cb.get(), NL_CB_DUMP_INTR, NL_CB_CUSTOM, onInterrupted, &dump);
      ifaddrmsg request{};
      request.ifa_family = AF_UNSPEC;
      kernelErrno_ = 0;
      int rc = nl_send_simple(sock_.get(), RTM_GETADDR, NLM_F_DUMP, &request, sizeof request);
      if (rc >= 0) rc = nl_recvmsgs(sock_.get(), cb.get());
      if (rc < 0) return std::unexpected(linkError(what, kernelErrno_ != 0 ? kernelErrno_ : errnoFromLibnl(rc)));
      if (!dump.interrupted) return std::move(dump.addresses);
    }
    return std::unexpected(linkError(what + ": the dump was interrupted by changes five times", EINTR));
  }

  core::Result<void> addAddress(const std::string& name, const net::Prefix& address) override {
    return changeAddress(name, address, true);
  }

  core::Result<void> deleteAddress(const std::string& name, const net::Prefix& address) override {
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

  core::Result<void> changeAddress(const std::string& name, const net::Prefix& address, bool add) {
    const std::string what = add ? fmt::format("add address {} to {}", address.toString(), name)
                                 : fmt::format("delete address {} from {}", address.toString(), name);
    auto ifindex = indexOf(name, what);
    if (!ifindex) return std::unexpected(ifindex.error());
    const int family = address.v6() ? AF_INET6 : AF_INET;
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
