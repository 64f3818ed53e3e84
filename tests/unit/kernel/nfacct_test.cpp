// nfacct's messages as the kernel reads and writes them (include/uapi/linux/netfilter/
// nfnetlink_acct.h, net/netfilter/nfnetlink_acct.c), and the fake's rules.

#include <catch2/catch.hpp>

#include <endian.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_acct.h>
#include <sys/socket.h>

#include <array>
#include <cstring>
#include <string>

#include "kproxy/kernel/nfacct.h"

using namespace kproxy;
using kernel::NfacctRequest;

namespace {

/// An object description as nfnl_acct_fill_info writes it; `skip` leaves one attribute out.
struct KernelReply {
  alignas(nlmsghdr) std::array<char, 256> buf{};
  nlmsghdr* nlh = nullptr;
  explicit KernelReply(const char* name, std::uint64_t packets, std::uint64_t bytes, int skip = 0) {
    nlh = mnl_nlmsg_put_header(buf.data());
    nlh->nlmsg_type = (NFNL_SUBSYS_ACCT << 8) | NFNL_MSG_ACCT_NEW;
    auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
    nfg->nfgen_family = AF_UNSPEC;
    if (skip != NFACCT_NAME) mnl_attr_put_strz(nlh, NFACCT_NAME, name);
    if (skip != NFACCT_PKTS) mnl_attr_put_u64(nlh, NFACCT_PKTS, htobe64(packets));
    if (skip != NFACCT_BYTES) mnl_attr_put_u64(nlh, NFACCT_BYTES, htobe64(bytes));
    mnl_attr_put_u32(nlh, NFACCT_USE, htobe32(2));
  }
};

}  // namespace

TEST_CASE("nfacct requests: upstream's GET and NEW of one name, acknowledged", "[unit]") {
  alignas(nlmsghdr) std::array<char, kernel::kNfacctRequestRoom> buf{};
  const nlmsghdr* get = kernel::encodeNfacctRequest(buf, NfacctRequest::kGet, "ct_state_invalid_dropped_pkts", 42);
  CHECK(get->nlmsg_type == 0x0701);  // NFNL_SUBSYS_ACCT (7) << 8 | NFNL_MSG_ACCT_GET (1)
  CHECK(get->nlmsg_flags == (NLM_F_REQUEST | NLM_F_ACK));
  CHECK(get->nlmsg_seq == 42);
  const auto* nfg = static_cast<const nfgenmsg*>(mnl_nlmsg_get_payload(get));
  CHECK(nfg->nfgen_family == AF_UNSPEC);
  CHECK(nfg->version == NFNETLINK_V0);
  CHECK(nfg->res_id == 0);
  // One attribute: the name with its NUL, padded to 4 bytes.
  const auto* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(get, sizeof(nfgenmsg)));
  CHECK(mnl_attr_get_type(attr) == NFACCT_NAME);
  CHECK(attr->nla_len == NLA_HDRLEN + std::strlen("ct_state_invalid_dropped_pkts") + 1);
  CHECK(std::string(mnl_attr_get_str(attr)) == "ct_state_invalid_dropped_pkts");
  CHECK(get->nlmsg_len == NLMSG_LENGTH(sizeof(nfgenmsg)) + MNL_ALIGN(attr->nla_len));

  const nlmsghdr* create = kernel::encodeNfacctRequest(buf, NfacctRequest::kCreate, "localhost_nps_accepted_pkts", 7);
  CHECK(create->nlmsg_type == 0x0700);  // NFNL_MSG_ACCT_NEW (0)
  CHECK(create->nlmsg_flags == (NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE));
  const auto* name = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(create, sizeof(nfgenmsg)));
  CHECK(std::string(mnl_attr_get_str(name)) == "localhost_nps_accepted_pkts");
}

TEST_CASE("nfacct replies: the name and both big-endian counters, or a decode error", "[unit]") {
  KernelReply reply("ct_state_invalid_dropped_pkts", 0x0102030405060708ull, 1500);
  auto counter = kernel::decodeNfacctCounter(reply.nlh);
  REQUIRE(counter.has_value());
  CHECK(*counter == kernel::NfacctCounter{"ct_state_invalid_dropped_pkts", 0x0102030405060708ull, 1500});

  for (int missing : {NFACCT_NAME, NFACCT_PKTS, NFACCT_BYTES}) {
    INFO("without attribute " << missing);
    KernelReply partial("x", 1, 1, missing);
    auto r = kernel::decodeNfacctCounter(partial.nlh);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().category == core::ErrorCategory::kDecode);
  }
  KernelReply other("x", 1, 1);
  other.nlh->nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | NFNL_MSG_ACCT_NEW;
  CHECK_FALSE(kernel::decodeNfacctCounter(other.nlh).has_value());
  // A message that ends inside the byte count (NFACCT_USE's 8 bytes and 4 of the count's 12).
  KernelReply truncated("x", 1, 1);
  truncated.nlh->nlmsg_len -= 12;
  CHECK_FALSE(kernel::decodeNfacctCounter(truncated.nlh).has_value());
}

TEST_CASE("the fake nfacct: ensure creates once and keeps counts; names have 1 to 31 characters", "[unit]") {
  kernel::FakeNfacct fake;
  auto absent = fake.get("ct_state_invalid_dropped_pkts");
  REQUIRE_FALSE(absent.has_value());
  CHECK(absent.error().errnum == ENOENT);
  REQUIRE(fake.ensure("ct_state_invalid_dropped_pkts"));
  fake.objects["ct_state_invalid_dropped_pkts"].packets = 3;
  REQUIRE(fake.ensure("ct_state_invalid_dropped_pkts"));
  CHECK(fake.get("ct_state_invalid_dropped_pkts")->packets == 3);
  CHECK(fake.get(std::string(32, 'a')).error().errnum == EINVAL);
  CHECK(fake.get("").error().errnum == EINVAL);
  CHECK(fake.ensure(std::string(31, 'a')));
}
