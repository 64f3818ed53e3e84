#include "kproxy/kernel/netlink_socket.h"

#include <libmnl/libmnl.h>
#include <linux/netlink.h>
#include <sys/socket.h>

#include <cerrno>
#include <ctime>
#include <string>
#include <utility>

namespace kproxy::kernel {

using core::ErrorCategory;
using core::makeError;

NetlinkSocket::NetlinkSocket(mnl_socket* socket)
    : socket_(socket), seq_(static_cast<std::uint32_t>(std::time(nullptr))) {}

NetlinkSocket::NetlinkSocket(NetlinkSocket&& other) noexcept
    : socket_(std::exchange(other.socket_, nullptr)), seq_(other.seq_) {}

NetlinkSocket& NetlinkSocket::operator=(NetlinkSocket&& other) noexcept {
  if (this != &other) {
    if (socket_ != nullptr) mnl_socket_close(socket_);
    socket_ = std::exchange(other.socket_, nullptr);
    seq_ = other.seq_;
  }
  return *this;
}

NetlinkSocket::~NetlinkSocket() {
  if (socket_ != nullptr) mnl_socket_close(socket_);
}

core::Result<NetlinkSocket*> keptSocket(std::optional<NetlinkSocket>& kept, int bus) {
  if (!kept) {
    auto opened = NetlinkSocket::open(bus);
    if (!opened) return std::unexpected(opened.error());
    kept.emplace(std::move(*opened));
  }
  return &*kept;
}

core::Result<NetlinkSocket> NetlinkSocket::open(int bus) {
  mnl_socket* s = mnl_socket_open(bus);
  if (s == nullptr) return makeError(ErrorCategory::kKernel, "netlink: socket", errno);
  if (mnl_socket_bind(s, 0, MNL_SOCKET_AUTOPID) < 0) {
    int err = errno;
    mnl_socket_close(s);
    return makeError(ErrorCategory::kKernel, "netlink: bind", err);
  }
  // Large dumps (hundreds of thousands of rules) arrive faster than we parse them.
  int rcv = 16 << 20;
  if (setsockopt(mnl_socket_get_fd(s), SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof rcv) != 0)
    setsockopt(mnl_socket_get_fd(s), SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  return NetlinkSocket(s);
}

std::uint32_t NetlinkSocket::portId() const { return mnl_socket_get_portid(socket_); }

std::uint32_t NetlinkSocket::nextSeq(std::uint32_t count) {
  std::uint32_t first = ++seq_;
  seq_ += count;
  return first;
}

core::Result<std::vector<NetlinkFailure>> NetlinkSocket::sendBatch(std::span<const char> messages) {
  const std::span<const char> parts[] = {messages};
  return sendBatch(parts);
}

core::Result<std::vector<NetlinkFailure>> NetlinkSocket::sendBatch(std::span<const std::span<const char>> parts) {
  int fd = mnl_socket_get_fd(socket_);
  std::vector<iovec> iov;
  std::size_t size = 0;
  for (const auto& part : parts) {
    if (part.empty()) continue;
    iov.push_back(iovec{const_cast<char*>(part.data()), part.size()});
    size += part.size();
  }
  // The whole batch must fit the send buffer to go in one sendmsg (one transaction).
  int snd = static_cast<int>(std::min<std::size_t>(size + (1 << 16), 1u << 30));
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &snd, sizeof snd) != 0)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, sizeof snd);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  msghdr msg{};
  msg.msg_name = &kernel;
  msg.msg_namelen = sizeof kernel;
  msg.msg_iov = iov.data();
  msg.msg_iovlen = iov.size();
  if (sendmsg(fd, &msg, 0) < 0)
    return makeError(ErrorCategory::kKernel, "netlink: sending a batch of " + std::to_string(size) + " bytes",
                     errno);

  std::vector<NetlinkFailure> failures;
  std::vector<char> buf(MNL_SOCKET_BUFFER_SIZE * 4);
  for (;;) {
    ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (errno == EINTR) continue;
      return makeError(ErrorCategory::kKernel, "netlink: reading batch replies", errno);
    }
    int len = static_cast<int>(n);
    for (auto* nlh = reinterpret_cast<const nlmsghdr*>(buf.data()); mnl_nlmsg_ok(nlh, len);
         nlh = mnl_nlmsg_next(nlh, &len)) {
      if (nlh->nlmsg_type != NLMSG_ERROR) continue;
      const auto* err = static_cast<const nlmsgerr*>(mnl_nlmsg_get_payload(nlh));
      if (err->error != 0) failures.push_back(NetlinkFailure{nlh->nlmsg_seq, -err->error});
    }
  }
  return failures;
}

void NetlinkSocket::drainDump(std::span<char> buf, std::size_t filled, std::uint32_t seq) {
  // Whether `len` bytes of buf hold the dump's last message (NLMSG_DONE, or an error).
  auto ends = [seq](const char* data, std::size_t len) {
    int left = static_cast<int>(len);
    for (auto* m = reinterpret_cast<const nlmsghdr*>(data); mnl_nlmsg_ok(m, left); m = mnl_nlmsg_next(m, &left))
      if (m->nlmsg_seq == seq && (m->nlmsg_type == NLMSG_DONE || m->nlmsg_type == NLMSG_ERROR)) return true;
    return false;
  };
  if (ends(buf.data(), filled)) return;
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(socket_, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || ends(buf.data(), static_cast<std::size_t>(n))) return;
  }
}

core::Result<void> NetlinkSocket::dump(const nlmsghdr* request,
                                       const std::function<bool(const nlmsghdr*)>& onMessage) {
  if (mnl_socket_sendto(socket_, request, request->nlmsg_len) < 0)
    return makeError(ErrorCategory::kKernel, "netlink: sending a dump request", errno);
  struct Ctx {
    const std::function<bool(const nlmsghdr*)>* fn;
    bool ok = true;
  } ctx{&onMessage};
  // Room for any datagram a dump sends (the kernel's are usually at most 32 KiB), left
  // uninitialised: only the pages a reply fills become resident, not the whole megabyte.
  constexpr std::size_t kDumpBuffer = 1 << 20;
  std::unique_ptr<char[]> storage(new char[kDumpBuffer]);
  const std::span<char> buf(storage.get(), kDumpBuffer);
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(socket_, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return makeError(ErrorCategory::kKernel, "netlink: reading a dump", errno);
    }
    int r = mnl_cb_run(
        buf.data(), static_cast<std::size_t>(n), request->nlmsg_seq, portId(),
        [](const nlmsghdr* nlh, void* data) -> int {
          auto* c = static_cast<Ctx*>(data);
          if (!(*c->fn)(nlh)) c->ok = false;
          return MNL_CB_OK;
        },
        &ctx);
    if (r == MNL_CB_STOP) break;
    if (r < 0) {
      const int err = errno;
      // EINTR: what was dumped changed while it was read (NLM_F_DUMP_INTR); the caller reads
      // again. The rest of this dump is still queued: read it away, or the next request on
      // this socket would get it.
      if (err == EINTR) drainDump(buf, static_cast<std::size_t>(n), request->nlmsg_seq);
      // ENOENT: the table/set asked for does not exist; report it to the caller.
      return makeError(ErrorCategory::kKernel, "netlink: dump", err);
    }
  }
  if (!ctx.ok) return makeError(ErrorCategory::kDecode, "netlink: could not decode a dump reply");
  return {};
}

}  // namespace kproxy::kernel
