#pragma once
/// A netlink socket (libmnl) for backends that talk to the kernel directly: one big batch in a
/// single sendmsg (atomic nfnetlink transactions), and dumps. Not thread-safe: one owner.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kproxy/core/error.h"

struct mnl_socket;
struct nlmsghdr;

namespace kproxy::kernel {

/// An error the kernel reported for the message with sequence number `seq`.
struct NetlinkFailure {
  std::uint32_t seq = 0;
  int errnum = 0;
};

class NetlinkSocket {
 public:
  /// Opens and binds a socket on `bus` (e.g. NETLINK_NETFILTER).
  static core::Result<NetlinkSocket> open(int bus);

  NetlinkSocket(NetlinkSocket&&) noexcept;
  NetlinkSocket& operator=(NetlinkSocket&&) noexcept;
  ~NetlinkSocket();

  /// Sends `messages` (already framed netlink messages) in one sendmsg, then collects every
  /// error the kernel queued for them. The kernel handles a netfilter batch synchronously
  /// inside sendmsg, so all replies are present when it returns. Empty result: accepted.
  core::Result<std::vector<NetlinkFailure>> sendBatch(std::span<const char> messages);
  /// The same, for a batch held in several buffers (sent in order, as one sendmsg).
  core::Result<std::vector<NetlinkFailure>> sendBatch(std::span<const std::span<const char>> parts);

  /// Sends one dump request and calls `onMessage` for each reply until NLMSG_DONE.
  /// `onMessage` returns false to report a decoding failure (the dump is still drained).
  /// An error with errnum EINTR: the objects changed during the dump (NLM_F_DUMP_INTR), so
  /// what `onMessage` got may be inconsistent; the caller dumps again.
  core::Result<void> dump(const nlmsghdr* request,
                          const std::function<bool(const nlmsghdr*)>& onMessage);

  std::uint32_t portId() const;
  /// A fresh sequence number base for a message or batch.
  std::uint32_t nextSeq(std::uint32_t count = 1);

 private:
  explicit NetlinkSocket(mnl_socket* socket);
  /// Reads away the rest of an interrupted dump (`filled` bytes of `buf` already read).
  void drainDump(std::span<char> buf, std::size_t filled, std::uint32_t seq);
  mnl_socket* socket_ = nullptr;
  std::uint32_t seq_ = 0;
};

/// The socket on `bus` held in `kept`, opened there on first use. Owners keep one for their
/// life: closing a netfilter socket after a commit waits for the kernel to release what the
/// commit replaced (an RCU grace period).
core::Result<NetlinkSocket*> keptSocket(std::optional<NetlinkSocket>& kept, int bus);

}  // namespace kproxy::kernel
