#include "kproxy/kernel/interface_addresses.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "kproxy/core/log.h"
#include "kproxy/kernel/netlink_socket.h"

namespace kproxy::kernel {
namespace {

using core::ErrorCategory;
using core::makeError;

// The interface index of `name` now, 0 when there is none or no name (no interface has index 0).
unsigned excludedIndex(const std::string& name) {
  return name.empty() ? 0 : ::if_nametoindex(name.c_str());
}

// Whether an address message is about an interface other than `excluded`.
bool counts(const nlmsghdr* nlh, unsigned excluded) {
  if (nlh->nlmsg_len < NLMSG_LENGTH(sizeof(ifaddrmsg))) return true;
  const auto* ifa = static_cast<const ifaddrmsg*>(mnl_nlmsg_get_payload(nlh));
  return excluded == 0 || ifa->ifa_index != excluded;
}

// One RTM_NEWADDR message's address; IFA_LOCAL (the own end of a point-to-point link) before
// IFA_ADDRESS, as Go's net.InterfaceAddrs reads it. Nothing for interface `excluded`.
bool addressOf(const nlmsghdr* nlh, unsigned excluded, std::vector<std::string>& out) {
  if (nlh->nlmsg_type != RTM_NEWADDR || !counts(nlh, excluded)) return true;
  const auto* ifa = static_cast<const ifaddrmsg*>(mnl_nlmsg_get_payload(nlh));
  if (ifa->ifa_family != AF_INET && ifa->ifa_family != AF_INET6) return true;
  const nlattr* found[IFA_MAX + 1] = {};
  mnl_attr_parse(
      nlh, sizeof(ifaddrmsg),
      [](const nlattr* attr, void* data) -> int {
        const auto type = mnl_attr_get_type(attr);
        if (type <= IFA_MAX) static_cast<const nlattr**>(data)[type] = attr;
        return MNL_CB_OK;
      },
      found);
  const nlattr* chosen = found[IFA_LOCAL] != nullptr ? found[IFA_LOCAL] : found[IFA_ADDRESS];
  if (chosen == nullptr) return true;
  const std::size_t want = ifa->ifa_family == AF_INET ? 4 : 16;
  if (mnl_attr_get_payload_len(chosen) != want) return false;
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(ifa->ifa_family, mnl_attr_get_payload(chosen), text, sizeof text) == nullptr)
    return false;
  out.emplace_back(text);
  return true;
}

core::Result<std::vector<std::string>> dumpAddressesOnce(NetlinkSocket& socket,
                                                         const std::string& excludedInterface) {
  char buf[MNL_SOCKET_BUFFER_SIZE];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = RTM_GETADDR;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  nlh->nlmsg_seq = socket.nextSeq();
  auto* ifa = static_cast<ifaddrmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifaddrmsg)));
  ifa->ifa_family = AF_UNSPEC;
  std::vector<std::string> out;
  const unsigned excluded = excludedIndex(excludedInterface);
  if (auto r = socket.dump(nlh, [&](const nlmsghdr* m) { return addressOf(m, excluded, out); }); !r)
    return makeError(r.error().category, "reading interface addresses: " + r.error().context,
                     r.error().errnum);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// An address added or removed during a dump interrupts it (a pod's veth getting its
// link-local address, say): read again, a few times.
core::Result<std::vector<std::string>> dumpAddresses(NetlinkSocket& socket,
                                                     const std::string& excludedInterface) {
  for (int attempt = 1;; ++attempt) {
    auto out = dumpAddressesOnce(socket, excludedInterface);
    if (out || out.error().errnum != EINTR || attempt == 20) return out;
  }
}

}  // namespace

core::Result<std::vector<std::string>> readInterfaceAddresses(std::string_view excludedInterface) {
  auto socket = NetlinkSocket::open(NETLINK_ROUTE);
  if (!socket) return std::unexpected(socket.error());
  return dumpAddresses(*socket, std::string(excludedInterface));
}

struct InterfaceAddressWatcher::Impl {
  Impl(NetlinkSocket d, mnl_socket* e, int s, std::string x, Callback cb, std::chrono::milliseconds q)
      : dump(std::move(d)), events(e), stopFd(s), excludedInterface(std::move(x)),
        onChange(std::move(cb)), quiet(q) {}
  ~Impl() {
    if (thread.joinable()) {
      std::uint64_t one = 1;
      if (::write(stopFd, &one, sizeof one) < 0) { /* the thread still polls with a timeout */ }
      thread.join();
    }
    mnl_socket_close(events);
    ::close(stopFd);
  }

  NetlinkSocket dump;   // requests (the event socket only receives)
  mnl_socket* events;   // subscribed to address changes
  int stopFd;           // eventfd: written once to stop the thread
  std::string excludedInterface;  // whose addresses and changes are not the node's
  Callback onChange;
  std::chrono::milliseconds quiet;
  std::vector<std::string> last;
  std::thread thread;

  // Reads every queued notification; true when one was about an interface other than the
  // excluded one (IPVS mode binds every ClusterIP on kube-ipvs0), or some were lost.
  bool drain() {
    bool any = false;
    std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE);
    const unsigned excluded = excludedIndex(excludedInterface);
    for (;;) {
      ssize_t n = ::recv(mnl_socket_get_fd(events), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n > 0) {
        int left = static_cast<int>(n);
        for (auto* m = reinterpret_cast<const nlmsghdr*>(buf.data()); !any && mnl_nlmsg_ok(m, left);
             m = mnl_nlmsg_next(m, &left))
          any = counts(m, excluded);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      // ENOBUFS: the kernel dropped notifications; a fresh read covers them.
      if (n < 0 && errno == ENOBUFS) any = true;
      return any;
    }
  }

  void report() {
    auto addresses = dumpAddresses(dump, excludedInterface);
    if (!addresses) {
      // Retried after every quiet period; said once per run of failures.
      if (!failing)
        log::error("interface addresses could not be read; NodePort addresses keep the last list",
                   {{"error", addresses.error().message()}});
      failing = true;
      pending = true;
      return;
    }
    failing = false;
    pending = false;
    if (*addresses == last) return;
    last = *addresses;
    log::info(2, "Interface addresses changed", {{"count", std::to_string(last.size())}});
    onChange(std::move(*addresses));
  }

  bool pending = false;  // a change not yet reported (a read failed, or waiting for quiet)
  bool failing = false;  // the last read failed

  void run() {
    pollfd fds[2] = {{mnl_socket_get_fd(events), POLLIN, 0}, {stopFd, POLLIN, 0}};
    for (;;) {
      // Idle: wait for a change (or retry a failed read after `quiet`). Changing: wait for
      // `quiet` without further change, then report.
      int timeout = pending ? static_cast<int>(quiet.count()) : -1;
      fds[0].revents = fds[1].revents = 0;
      int n = ::poll(fds, 2, timeout);
      if (n < 0 && errno != EINTR) {
        log::error("interface address watcher stopped", {{"error", std::strerror(errno)}});
        return;
      }
      if (fds[1].revents != 0) return;
      if (n > 0 && (fds[0].revents & POLLIN) != 0) {
        if (drain()) pending = true;
        continue;  // restart the quiet period
      }
      if (n == 0 && pending) report();
    }
  }
};

InterfaceAddressWatcher::InterfaceAddressWatcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
InterfaceAddressWatcher::~InterfaceAddressWatcher() = default;

core::Result<std::unique_ptr<InterfaceAddressWatcher>> InterfaceAddressWatcher::start(
    std::string excludedInterface, Callback onChange, std::chrono::milliseconds quiet) {
  mnl_socket* events = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
  if (events == nullptr)
    return makeError(ErrorCategory::kKernel, "rtnetlink: socket for address changes", errno);
  if (mnl_socket_bind(events, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR, MNL_SOCKET_AUTOPID) < 0) {
    int err = errno;
    mnl_socket_close(events);
    return makeError(ErrorCategory::kKernel, "rtnetlink: subscribing to address changes", err);
  }
  auto dump = NetlinkSocket::open(NETLINK_ROUTE);
  if (!dump) {
    mnl_socket_close(events);
    return std::unexpected(dump.error());
  }
  int stopFd = ::eventfd(0, EFD_CLOEXEC);
  if (stopFd < 0) {
    int err = errno;
    mnl_socket_close(events);
    return makeError(ErrorCategory::kIo, "eventfd for the interface address watcher", err);
  }
  auto impl = std::make_unique<Impl>(std::move(*dump), events, stopFd, std::move(excludedInterface),
                                     std::move(onChange), quiet);
  // Subscribed first, read second: a change in between is both in the read and queued.
  // A failed read is retried by the thread (after `quiet`, as after a change).
  if (auto first = dumpAddresses(impl->dump, impl->excludedInterface)) {
    impl->last = *first;
    impl->onChange(std::move(*first));
  } else {
    log::error("interface addresses could not be read; retrying", {{"error", first.error().message()}});
    impl->failing = true;
    impl->pending = true;
  }
  impl->thread = std::thread([raw = impl.get()] { raw->run(); });
  return std::unique_ptr<InterfaceAddressWatcher>(new InterfaceAddressWatcher(std::move(impl)));
}

}  // namespace kproxy::kernel
