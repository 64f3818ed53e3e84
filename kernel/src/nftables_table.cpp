#include "kproxy/kernel/nftables_table.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <sys/socket.h>

#include <cerrno>
#include <span>
#include <string>

namespace kproxy::kernel {

core::Result<bool> deleteNftablesTable(NetlinkSocket& socket, std::uint8_t nfproto, std::string_view name) {
  const std::uint32_t seq = socket.nextSeq(3);
  alignas(nlmsghdr) char buffer[512];
  std::size_t used = 0;
  auto message = [&](std::uint16_t type, std::uint8_t family, std::uint16_t resId, std::uint32_t n) {
    nlmsghdr* nlh = mnl_nlmsg_put_header(buffer + used);
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST;
    nlh->nlmsg_seq = n;
    auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
    nfg->nfgen_family = family;
    nfg->version = NFNETLINK_V0;
    nfg->res_id = htons(resId);
    return nlh;
  };
  used += message(NFNL_MSG_BATCH_BEGIN, AF_UNSPEC, NFNL_SUBSYS_NFTABLES, seq)->nlmsg_len;
  nlmsghdr* del = message(static_cast<std::uint16_t>((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_DELTABLE), nfproto, 0,
                          seq + 1);
  mnl_attr_put_strz(del, NFTA_TABLE_NAME, std::string(name).c_str());
  used += del->nlmsg_len;
  used += message(NFNL_MSG_BATCH_END, AF_UNSPEC, NFNL_SUBSYS_NFTABLES, seq + 2)->nlmsg_len;
  auto failures = socket.sendBatch(std::span<const char>(buffer, used));
  if (!failures) return std::unexpected(failures.error());
  for (const auto& f : *failures) {
    if (f.errnum == ENOENT) return false;
    return core::makeError(core::ErrorCategory::kKernel,
                           std::string("nftables: delete table ") + (nfproto == NFPROTO_IPV6 ? "ip6 " : "ip ") +
                               std::string(name),
                           f.errnum);
  }
  return true;
}

}  // namespace kproxy::kernel
