#include "kproxy/kernel/nfacct.h"

#include <endian.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_acct.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <optional>

#include "kproxy/kernel/netlink_socket.h"

namespace kproxy::kernel {
namespace {

using core::ErrorCategory;
using core::makeError;

core::Result<void> checkName(const std::string& name) {
  if (name.empty() || name.size() > kNfacctNameMax)
    return makeError(ErrorCategory::kInvalidArgument,
                     "nfacct: object name \"" + name + "\" must have 1 to " + std::to_string(kNfacctNameMax) +
                         " characters",
                     EINVAL);
  return {};
}

class NetlinkNfacct final : public Nfacct {
 public:
  explicit NetlinkNfacct(NetlinkSocket socket) : socket_(std::move(socket)) {}

  core::Result<NfacctCounter> get(const std::string& name) override {
    if (auto ok = checkName(name); !ok) return std::unexpected(ok.error());
    std::optional<NfacctCounter> found;
    bool malformed = false;
    auto sent = send(NfacctRequest::kGet, name, [&](const nlmsghdr* reply) {
      auto counter = decodeNfacctCounter(reply);
      if (!counter) {
        malformed = true;
        return false;
      }
      found = std::move(*counter);
      return true;
    });
    if (!sent) {
      if (sent.error().errnum == ENOENT)
        return makeError(ErrorCategory::kNotFound, "nfacct: no object \"" + name + "\"", ENOENT);
      return std::unexpected(sent.error());
    }
    if (malformed || !found)
      return makeError(ErrorCategory::kDecode, "nfacct: the kernel's answer for \"" + name + "\" was not understood");
    return *found;
  }

  core::Result<void> ensure(const std::string& name) override {
    auto existing = get(name);
    if (existing) return {};
    if (existing.error().errnum != ENOENT) return std::unexpected(existing.error());
    auto created = send(NfacctRequest::kCreate, name, [](const nlmsghdr*) { return true; });
    // EBUSY: it exists after all (created meanwhile, as upstream's handleError reads it).
    if (!created && created.error().errnum != EBUSY) return std::unexpected(created.error());
    return {};
  }

 private:
  /// One request, its replies to `onReply`, until the kernel's acknowledgement or error.
  core::Result<void> send(NfacctRequest request, const std::string& name,
                          const std::function<bool(const nlmsghdr*)>& onReply) {
    alignas(nlmsghdr) std::array<char, kNfacctRequestRoom> buf{};
    const nlmsghdr* message = encodeNfacctRequest(buf, request, name, socket_.nextSeq());
    auto r = socket_.dump(message, onReply);
    if (!r) {
      return makeError(r.error().category,
                       std::string("nfacct: ") + (request == NfacctRequest::kGet ? "get \"" : "create \"") + name +
                           "\": " + r.error().context,
                       r.error().errnum);
    }
    return {};
  }

  NetlinkSocket socket_;
};

}  // namespace

const nlmsghdr* encodeNfacctRequest(std::span<char> buf, NfacctRequest request, std::string_view name,
                                    std::uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf.data());
  const auto command = request == NfacctRequest::kCreate ? NFNL_MSG_ACCT_NEW : NFNL_MSG_ACCT_GET;
  nlh->nlmsg_type = static_cast<std::uint16_t>((NFNL_SUBSYS_ACCT << 8) | command);
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | (request == NfacctRequest::kCreate ? NLM_F_CREATE : 0);
  nlh->nlmsg_seq = seq;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = AF_UNSPEC;
  nfg->version = NFNETLINK_V0;
  nfg->res_id = 0;
  const std::string terminated(name.substr(0, kNfacctNameMax));
  mnl_attr_put_strz(nlh, NFACCT_NAME, terminated.c_str());
  return nlh;
}

core::Result<NfacctCounter> decodeNfacctCounter(const nlmsghdr* message) {
  auto malformed = [](const char* what) {
    return makeError(ErrorCategory::kDecode, std::string("nfacct: an object description ") + what);
  };
  if (message->nlmsg_len < NLMSG_LENGTH(sizeof(nfgenmsg))) return malformed("shorter than its header");
  if ((message->nlmsg_type >> 8) != NFNL_SUBSYS_ACCT || (message->nlmsg_type & 0xff) != NFNL_MSG_ACCT_NEW)
    return malformed("of another message type");
  std::array<const nlattr*, NFACCT_MAX + 1> attrs{};
  auto collect = [](const nlattr* attr, void* data) -> int {
    auto& table = *static_cast<std::array<const nlattr*, NFACCT_MAX + 1>*>(data);
    const auto type = mnl_attr_get_type(attr);
    if (type <= NFACCT_MAX) table[type] = attr;
    return MNL_CB_OK;
  };
  if (mnl_attr_parse(message, sizeof(nfgenmsg), collect, &attrs) < 0) return malformed("has broken attributes");
  const nlattr* name = attrs[NFACCT_NAME];
  const nlattr* packets = attrs[NFACCT_PKTS];
  const nlattr* bytes = attrs[NFACCT_BYTES];
  if (name == nullptr || mnl_attr_validate(name, MNL_TYPE_NUL_STRING) < 0) return malformed("has no name");
  if (packets == nullptr || mnl_attr_validate(packets, MNL_TYPE_U64) < 0) return malformed("has no packet count");
  if (bytes == nullptr || mnl_attr_validate(bytes, MNL_TYPE_U64) < 0) return malformed("has no byte count");
  // The counters are big-endian (the kernel's cpu_to_be64).
  return NfacctCounter{mnl_attr_get_str(name), be64toh(mnl_attr_get_u64(packets)), be64toh(mnl_attr_get_u64(bytes))};
}

core::Result<std::unique_ptr<Nfacct>> makeNetlinkNfacct() {
  auto socket = NetlinkSocket::open(NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  auto nfacct = std::make_unique<NetlinkNfacct>(std::move(*socket));
  // Upstream's probe: this name may exist or not; only another answer says no nfacct.
  auto probe = nfacct->get("IMayExist");
  if (!probe && probe.error().errnum != ENOENT)
    return makeError(ErrorCategory::kNotFound, "nfacct sub-system not available: " + probe.error().context,
                     probe.error().errnum);
  return std::unique_ptr<Nfacct>(std::move(nfacct));
}

core::Result<void> PrintingNfacct::ensure(const std::string& name) {
  if (auto existing = inner_->get(name); !existing && existing.error().errnum == ENOENT) {
    std::fprintf(out_, "nfacct add %s\n", name.c_str());
    std::fflush(out_);
  }
  return inner_->ensure(name);
}

core::Result<NfacctCounter> FakeNfacct::get(const std::string& name) {
  if (auto ok = checkName(name); !ok) return std::unexpected(ok.error());
  auto it = objects.find(name);
  if (it == objects.end()) return makeError(ErrorCategory::kNotFound, "nfacct: no object \"" + name + "\"", ENOENT);
  return it->second;
}

core::Result<void> FakeNfacct::ensure(const std::string& name) {
  ++ensureCalls;
  if (auto ok = checkName(name); !ok) return std::unexpected(ok.error());
  if (failEnsure) return makeError(ErrorCategory::kKernel, "nfacct: create \"" + name + "\" (fake)", EPERM);
  objects.try_emplace(name, NfacctCounter{name, 0, 0});
  return {};
}

}  // namespace kproxy::kernel
