// KernelIpvs over generic netlink (libnl-genl-3): one socket per adapter, one request at a
// time, each answered by an ACK, an error, or a dump ending in NLMSG_DONE.
#include <linux/ip_vs.h>

#include <cerrno>
#include <functional>

#include <fmt/format.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/msg.h>
#include <netlink/netlink.h>
#include <netlink/socket.h>

#include "ipvs_wire.h"
#include "kproxy/ipvs/kernel.h"
#include "kproxy/kernel/process.h"
#include "libnl_errors.h"

namespace kproxy::ipvs {
namespace {

struct SocketDeleter {
  void operator()(nl_sock* sock) const { nl_socket_free(sock); }
};
struct CallbackDeleter {
  void operator()(nl_cb* cb) const { nl_cb_put(cb); }
};
using Socket = std::unique_ptr<nl_sock, SocketDeleter>;
using Callbacks = std::unique_ptr<nl_cb, CallbackDeleter>;

/// What one exchange collected: the kernel's errno (not libnl's folded code), whether the
/// answer is complete, and the first reply that could not be decoded.
struct Exchange {
  const std::function<core::Result<void>(nl_msg*)>* onReply = nullptr;
  int kernelErrno = 0;
  bool done = false;
  std::optional<core::Error> replyError;
};

int onValid(nl_msg* msg, void* arg) {
  auto* ex = static_cast<Exchange*>(arg);
  if (ex->onReply == nullptr || ex->replyError) return NL_OK;
  if (auto r = (*ex->onReply)(msg); !r) ex->replyError = r.error();
  return NL_OK;  // keep reading: the rest of the dump must be drained either way
}

int onDone(nl_msg*, void* arg) {
  static_cast<Exchange*>(arg)->done = true;
  return NL_STOP;
}

int onDumpInterrupted(nl_msg*, void* arg) {
  // The tables changed during the dump; its result is not a consistent picture.
  auto* ex = static_cast<Exchange*>(arg);
  if (!ex->replyError)
    ex->replyError = core::Error{core::ErrorCategory::kTransient, EINTR, "ipvs: dump interrupted by a change"};
  return NL_OK;
}

int onError(sockaddr_nl*, nlmsgerr* err, void* arg) {
  auto* ex = static_cast<Exchange*>(arg);
  ex->kernelErrno = -err->error;
  ex->done = true;
  return NL_STOP;
}

class NetlinkIpvs final : public KernelIpvs {
 public:
  NetlinkIpvs(Socket sock, Callbacks cb, int family) : sock_(std::move(sock)), cb_(std::move(cb)), family_(family) {}

  core::Result<std::vector<VirtualServer>> listVirtualServers() override {
    const auto op = IpvsOperation::kListVirtualServers;
    auto msg = wire::newRequest(family_, IPVS_CMD_GET_SERVICE, NLM_F_DUMP);
    if (!msg) return std::unexpected(msg.error());
    std::vector<VirtualServer> out;
    std::function<core::Result<void>(nl_msg*)> collect = [&](nl_msg* reply) -> core::Result<void> {
      auto vs = wire::parseServiceReply(reply);
      if (!vs) return std::unexpected(vs.error());
      out.push_back(std::move(*vs));
      return {};
    };
    if (auto r = exchange(std::move(*msg), op, nullptr, nullptr, &collect); !r) return std::unexpected(r.error());
    return out;
  }

  core::Result<std::vector<RealServer>> listRealServers(const VirtualServer& vs) override {
    const auto op = IpvsOperation::kListRealServers;
    auto msg = request(IPVS_CMD_GET_DEST, NLM_F_DUMP, vs, false, nullptr);
    if (!msg) return std::unexpected(msg.error());
    std::vector<RealServer> out;
    std::function<core::Result<void>(nl_msg*)> collect = [&](nl_msg* reply) -> core::Result<void> {
      auto rs = wire::parseDestReply(reply, vs.family);
      if (!rs) return std::unexpected(rs.error());
      out.push_back(std::move(*rs));
      return {};
    };
    if (auto r = exchange(std::move(*msg), op, &vs, nullptr, &collect); !r) return std::unexpected(r.error());
    if (out.empty()) {
      // The kernel answers a destination dump of a missing service with an empty dump, not an
      // error; ask for the service itself to tell "none" from "no such virtual server".
      auto get = request(IPVS_CMD_GET_SERVICE, 0, vs, false, nullptr);
      if (!get) return std::unexpected(get.error());
      if (auto r = exchange(std::move(*get), op, &vs, nullptr, nullptr); !r) return std::unexpected(r.error());
    }
    return out;
  }

  core::Result<void> addVirtualServer(const VirtualServer& vs) override {
    return simple(IPVS_CMD_NEW_SERVICE, IpvsOperation::kAddVirtualServer, vs, true, nullptr);
  }
  core::Result<void> updateVirtualServer(const VirtualServer& vs) override {
    return simple(IPVS_CMD_SET_SERVICE, IpvsOperation::kUpdateVirtualServer, vs, true, nullptr);
  }
  core::Result<void> deleteVirtualServer(const VirtualServer& vs) override {
    return simple(IPVS_CMD_DEL_SERVICE, IpvsOperation::kDeleteVirtualServer, vs, false, nullptr);
  }
  core::Result<void> addRealServer(const VirtualServer& vs, const RealServer& rs) override {
    return simple(IPVS_CMD_NEW_DEST, IpvsOperation::kAddRealServer, vs, false, &rs);
  }
  core::Result<void> updateRealServer(const VirtualServer& vs, const RealServer& rs) override {
    return simple(IPVS_CMD_SET_DEST, IpvsOperation::kUpdateRealServer, vs, false, &rs);
  }
  core::Result<void> deleteRealServer(const VirtualServer& vs, const RealServer& rs) override {
    return simple(IPVS_CMD_DEL_DEST, IpvsOperation::kDeleteRealServer, vs, false, &rs);
  }

  core::Result<void> flush() override {
    auto msg = wire::newRequest(family_, IPVS_CMD_FLUSH);
    if (!msg) return std::unexpected(msg.error());
    return exchange(std::move(*msg), IpvsOperation::kFlush, nullptr, nullptr, nullptr);
  }

  core::Result<Timeouts> timeouts() override {
    auto msg = wire::newRequest(family_, IPVS_CMD_GET_CONFIG);
    if (!msg) return std::unexpected(msg.error());
    std::optional<Timeouts> got;
    std::function<core::Result<void>(nl_msg*)> collect = [&](nl_msg* reply) -> core::Result<void> {
      auto t = wire::parseTimeoutsReply(reply);
      if (!t) return std::unexpected(t.error());
      got = *t;
      return {};
    };
    if (auto r = exchange(std::move(*msg), IpvsOperation::kGetTimeouts, nullptr, nullptr, &collect); !r)
      return std::unexpected(r.error());
    if (!got) return core::makeError(core::ErrorCategory::kDecode, "ipvs: no reply to GET_CONFIG", EPROTO);
    return *got;
  }

  core::Result<void> setTimeouts(const Timeouts& timeouts) override {
    auto msg = wire::newRequest(family_, IPVS_CMD_SET_CONFIG);
    if (!msg) return std::unexpected(msg.error());
    if (auto r = wire::putTimeouts(msg->get(), timeouts); !r) return r;
    return exchange(std::move(*msg), IpvsOperation::kSetTimeouts, nullptr, nullptr, nullptr);
  }

 private:
  core::Result<wire::Message> request(std::uint8_t cmd, int flags, const VirtualServer& vs, bool fullService,
                                      const RealServer* rs) {
    auto msg = wire::newRequest(family_, cmd, flags);
    if (!msg) return msg;
    if (auto r = wire::putService(msg->get(), vs, fullService); !r) return std::unexpected(r.error());
    if (rs != nullptr)
      if (auto r = wire::putDest(msg->get(), *rs, true); !r) return std::unexpected(r.error());
    return msg;
  }

  core::Result<void> simple(std::uint8_t cmd, IpvsOperation op, const VirtualServer& vs, bool fullService,
                            const RealServer* rs) {
    auto msg = request(cmd, 0, vs, fullService, rs);
    if (!msg) return std::unexpected(msg.error());
    return exchange(std::move(*msg), op, &vs, rs, nullptr);
  }

  /// Sends `msg` and reads until its ACK, its error or the end of its dump, handing every
  /// reply to `onReply`.
  core::Result<void> exchange(wire::Message msg, IpvsOperation op, const VirtualServer* vs, const RealServer* rs,
                              const std::function<core::Result<void>(nl_msg*)>* onReply) {
    Exchange ex;
    ex.onReply = onReply;
    nl_cb_set(cb_.get(), NL_CB_VALID, NL_CB_CUSTOM, onValid, &ex);
    nl_cb_set(cb_.get(), NL_CB_ACK, NL_CB_CUSTOM, onDone, &ex);
    nl_cb_set(cb_.get(), NL_CB_FINISH, NL_CB_CUSTOM, onDone, &ex);
    nl_cb_set(cb_.get(), NL_CB_DUMP_INTR, NL_CB_CUSTOM, onDumpInterrupted, &ex);
    nl_cb_err(cb_.get(), NL_CB_CUSTOM, onError, &ex);
    if (int rc = nl_send_auto(sock_.get(), msg.get()); rc < 0)
      return std::unexpected(ipvsError(op, errnoFromLibnl(rc), vs, rs));
    while (!ex.done) {
      int rc = nl_recvmsgs(sock_.get(), cb_.get());
      if (ex.kernelErrno != 0) return std::unexpected(ipvsError(op, ex.kernelErrno, vs, rs));
      if (rc < 0 && !ex.done) return std::unexpected(ipvsError(op, errnoFromLibnl(rc), vs, rs));
    }
    if (ex.kernelErrno != 0) return std::unexpected(ipvsError(op, ex.kernelErrno, vs, rs));
    if (ex.replyError) return std::unexpected(*ex.replyError);
    return {};
  }

  Socket sock_;
  Callbacks cb_;
  int family_;
};

core::Result<int> resolveFamily(nl_sock* sock) {
  int id = genl_ctrl_resolve(sock, IPVS_GENL_NAME);
  if (id >= 0) return id;
  if (id != -NLE_OBJ_NOTFOUND)
    return core::makeError(core::ErrorCategory::kKernel,
                           fmt::format("ipvs: resolving generic netlink family {}: {}", IPVS_GENL_NAME, nl_geterror(id)),
                           errnoFromLibnl(id));
  return core::makeError(core::ErrorCategory::kNotFound, "the kernel has no IPVS", ENOENT);
}

}  // namespace

core::Result<std::unique_ptr<KernelIpvs>> makeNetlinkIpvs() {
  Socket sock(nl_socket_alloc());
  Callbacks cb(nl_cb_alloc(NL_CB_DEFAULT));
  if (!sock || !cb) return core::makeError(core::ErrorCategory::kTransient, "ipvs: allocating a netlink socket", ENOMEM);
  if (int rc = genl_connect(sock.get()); rc < 0)
    return core::makeError(core::ErrorCategory::kKernel, fmt::format("ipvs: genl_connect: {}", nl_geterror(rc)),
                           errnoFromLibnl(rc));
  // Dumps of many services come in messages bigger than a page: size each read by peeking.
  nl_socket_enable_msg_peek(sock.get());
  auto family = resolveFamily(sock.get());
  if (!family && family.error().category == core::ErrorCategory::kNotFound) {
    // ip_vs registers the family when it loads; nothing asks for it by the family's name.
    std::string detail = "modprobe is not installed";
    if (auto modprobe = kernel::findExecutable("modprobe")) {
      kernel::ProcessOptions options;
      options.timeout = std::chrono::seconds(30);
      auto ran = kernel::runProcess({*modprobe, "ip_vs"}, options);
      if (!ran) {
        detail = ran.error().message();
      } else if (ran->exitCode != 0) {
        detail = fmt::format("modprobe ip_vs exited with {}: {}", ran->exitCode, ran->err);
        while (!detail.empty() && (detail.back() == '\n' || detail.back() == ' ')) detail.pop_back();
      } else {
        family = resolveFamily(sock.get());
        detail = "modprobe ip_vs succeeded but the IPVS family is still missing";
      }
    }
    if (!family)
      return core::makeError(core::ErrorCategory::kNotFound,
                             "the kernel has no IPVS: modprobe ip_vs failed or the module is missing (" + detail + ")",
                             ENOENT);
  }
  if (!family) return std::unexpected(family.error());
  return std::make_unique<NetlinkIpvs>(std::move(sock), std::move(cb), *family);
}

}  // namespace kproxy::ipvs
