#pragma once
/// Deleting one nftables table by name over netlink, without listing anything: what the
/// nftables backend's cleanup and kproxy's removal of the other modes' tables share.
/// Thread-safety: as the socket (one owner).

#include <cstdint>
#include <string_view>

#include "kproxy/core/error.h"
#include "kproxy/kernel/netlink_socket.h"

namespace kproxy::kernel {

/// Deletes table `name` of `nfproto` (NFPROTO_IPV4 or NFPROTO_IPV6) in one transaction (batch
/// begin, DELTABLE, batch end). True when it existed, false when there was none (ENOENT); any
/// other refusal is an error of category kKernel, "nftables: delete table ip NAME", with the
/// kernel's errno (EPROTONOSUPPORT / EAFNOSUPPORT where the kernel has no nftables).
core::Result<bool> deleteNftablesTable(NetlinkSocket& socket, std::uint8_t nfproto, std::string_view name);

}  // namespace kproxy::kernel
