// KernelNftables over netlink: libnftnl builds the messages, libmnl carries them.

#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <endian.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <libmnl/libmnl.h>
#include <libnftnl/batch.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/gen.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>

#include "kproxy/kernel/message_buffer.h"
#include "kproxy/kernel/netlink_socket.h"
#include "kproxy/kernel/nftables_table.h"
#include "kproxy/nftables/kernel.h"
#include "nftnl_encode.h"

namespace kproxy::nftables {
namespace {

using core::ErrorCategory;
using core::makeError;

template <typename T, void (*Free)(const T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using TablePtr = std::unique_ptr<nftnl_table, Deleter<nftnl_table, nftnl_table_free>>;
using ChainPtr = std::unique_ptr<nftnl_chain, Deleter<nftnl_chain, nftnl_chain_free>>;
using RulePtr = std::unique_ptr<nftnl_rule, Deleter<nftnl_rule, nftnl_rule_free>>;
using SetPtr = std::unique_ptr<nftnl_set, Deleter<nftnl_set, nftnl_set_free>>;

/// Netlink messages, written in place by libnftnl. A full sync's batch is hundreds of MiB at
/// scale and must reach the kernel in one sendmsg (nfnetlink commits a batch only if its begin
/// and end are in the same skb), so it is held whole.
using kernel::MessageBuffer;

SetPtr setHandle(const std::string& table, net::Family family, const std::string& name) {
  SetPtr s(nftnl_set_alloc());
  nftnl_set_set_u32(s.get(), NFTNL_SET_FAMILY, nfproto(family));
  nftnl_set_set_str(s.get(), NFTNL_SET_TABLE, table.c_str());
  nftnl_set_set_str(s.get(), NFTNL_SET_NAME, name.c_str());
  return s;
}

void encodeVerdict(nftnl_set_elem* e, const Verdict& v) {
  nftnl_set_elem_set_u32(e, NFTNL_SET_ELEM_VERDICT, verdictCode(v.kind));
  if (v.kind == VerdictKind::kJump || v.kind == VerdictKind::kGoto)
    nftnl_set_elem_set_str(e, NFTNL_SET_ELEM_CHAIN, v.chain.c_str());
}

std::string verdictText(std::int32_t code, const char* chain) {
  switch (code) {
    case NF_ACCEPT: return "accept";
    case NF_DROP: return "drop";
    case NFT_RETURN: return "return";
    case NFT_JUMP: return std::string("jump ") + (chain ? chain : "");
    case NFT_GOTO: return std::string("goto ") + (chain ? chain : "");
    default: return "verdict " + std::to_string(code);
  }
}

/// How many ops from `from` go into one element message: a run of additions (or deletions)
/// in the same set, at most kElementsPerMessage. One message per element would make the kernel
/// look the set up by name for each, and make the batch several times bigger.
constexpr std::size_t kElementsPerMessage = 256;
std::size_t elementRun(std::span<const Op> ops, std::size_t from) {
  const Op& first = ops[from];
  if (first.kind != OpKind::kAddElement && first.kind != OpKind::kDeleteElement) return 1;
  std::size_t n = 1;
  while (from + n < ops.size() && n < kElementsPerMessage) {
    const Op& o = ops[from + n];
    if (o.kind != first.kind || o.family != first.family || o.name != first.name) break;
    ++n;
  }
  return n;
}

/// Encodes `run` (one op, or a run of element ops of one set) as one message.
void encodeOp(MessageBuffer& out, const std::string& table, std::span<const Op> run, std::uint32_t seq) {
  const Op& op = run.front();
  const std::uint16_t fam = nfproto(op.family);
  std::size_t room = 1 << 16;
  for (const Op& o : run)
    if (o.element) room += 64 + o.element->key.size() + o.element->data.size() + (o.element->value ? o.element->value->chain.size() : 0);
  char* buf = out.tail(room);
  nlmsghdr* nlh = nullptr;
  switch (op.kind) {
    case OpKind::kAddTable: {
      TablePtr t(nftnl_table_alloc());
      nftnl_table_set_u32(t.get(), NFTNL_TABLE_FAMILY, fam);
      nftnl_table_set_str(t.get(), NFTNL_TABLE_NAME, table.c_str());
      nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_NEWTABLE, fam, NLM_F_CREATE, seq);
      nftnl_table_nlmsg_build_payload(nlh, t.get());
      break;
    }
    case OpKind::kAddSet: {
      SetPtr s(encodeSet(op.family, table, *op.set));
      nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_NEWSET, fam, NLM_F_CREATE, seq);
      nftnl_set_nlmsg_build_payload(nlh, s.get());
      break;
    }
    case OpKind::kAddChain: {
      ChainPtr c(encodeChain(op.family, table, op.name, op.base.get()));
      nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_NEWCHAIN, fam, NLM_F_CREATE, seq);
      nftnl_chain_nlmsg_build_payload(nlh, c.get());
      break;
    }
    case OpKind::kFlushChain: {
      RulePtr r(nftnl_rule_alloc());
      nftnl_rule_set_u32(r.get(), NFTNL_RULE_FAMILY, fam);
      nftnl_rule_set_str(r.get(), NFTNL_RULE_TABLE, table.c_str());
      nftnl_rule_set_str(r.get(), NFTNL_RULE_CHAIN, op.name.c_str());
      nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_DELRULE, fam, 0, seq);
      nftnl_rule_nlmsg_build_payload(nlh, r.get());
      break;
    }
    case OpKind::kAddRule: {
      RulePtr r(encodeRule(op.family, table, op.name, op.rule, op.ruleHash));
      nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_NEWRULE, fam, NLM_F_APPEND | NLM_F_CREATE, seq);
      nftnl_rule_nlmsg_build_payload(nlh, r.get());
      break;
    }
    case OpKind::kAddElement:
    case OpKind::kDeleteElement: {
      // One message for the run of element ops on the same set (see elementRun).
      SetPtr s = setHandle(table, op.family, op.name);
      const bool add = op.kind == OpKind::kAddElement;
      for (const Op& o : run) {
        nftnl_set_elem* e = nftnl_set_elem_alloc();
        const std::string_view key = o.element->kernelKey();
        nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, key.data(), static_cast<std::uint32_t>(key.size()));
        if (o.element->intervalEnd) nftnl_set_elem_set_u32(e, NFTNL_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
        if (add && o.element->value) encodeVerdict(e, *o.element->value);
        if (add && !o.element->data.empty())
          nftnl_set_elem_set(e, NFTNL_SET_ELEM_DATA, o.element->data.data(),
                             static_cast<std::uint32_t>(o.element->data.size()));
        nftnl_set_elem_add(s.get(), e);
      }
      nlh = nftnl_nlmsg_build_hdr(buf, add ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM, fam,
                                  add ? NLM_F_CREATE : 0, seq);
      nftnl_set_elems_nlmsg_build_payload(nlh, s.get());
      break;
    }
    case OpKind::kDeleteChain: {
      ChainPtr c(encodeChain(op.family, table, op.name, nullptr));
      nlh = nftnl_nlmsg_build_hdr(buf, NFT_MSG_DELCHAIN, fam, 0, seq);
      nftnl_chain_nlmsg_build_payload(nlh, c.get());
      break;
    }
  }
  out.commit(nlh);
}

/// Names the object of an encoded message from its bytes: a full sync's batch keeps no op
/// texts (they would cost as much as a tenth of the batch), so a refusal is described from the
/// message the kernel refused.
std::string describeMessage(const std::string& table, const nlmsghdr* nlh) {
  const auto type = static_cast<std::uint16_t>(NFNL_MSG_TYPE(nlh->nlmsg_type));
  const auto* nfg = static_cast<const nfgenmsg*>(mnl_nlmsg_get_payload(nlh));
  const std::string fam = std::string(familyKeyword(nfg->nfgen_family == NFPROTO_IPV6 ? net::Family::kIPv6 : net::Family::kIPv4));
  auto hex = [](const void* data, std::uint32_t len) {
    std::string out = "0x";
    for (std::uint32_t i = 0; i < len; ++i) out += fmt::format("{:02x}", static_cast<const unsigned char*>(data)[i]);
    return out;
  };
  switch (type) {
    case NFT_MSG_NEWCHAIN:
    case NFT_MSG_DELCHAIN: {
      ChainPtr c(nftnl_chain_alloc());
      if (nftnl_chain_nlmsg_parse(nlh, c.get()) < 0) break;
      return fmt::format("{} chain {} {} {}", type == NFT_MSG_NEWCHAIN ? "add" : "delete", fam, table,
                         nftnl_chain_get_str(c.get(), NFTNL_CHAIN_NAME));
    }
    case NFT_MSG_NEWRULE:
    case NFT_MSG_DELRULE: {
      RulePtr r(nftnl_rule_alloc());
      if (nftnl_rule_nlmsg_parse(nlh, r.get()) < 0) break;
      return fmt::format("{} {} {} {} (a rule of that chain)", type == NFT_MSG_NEWRULE ? "add rule" : "flush chain", fam,
                         table, nftnl_rule_get_str(r.get(), NFTNL_RULE_CHAIN));
    }
    case NFT_MSG_NEWSETELEM:
    case NFT_MSG_DELSETELEM: {
      SetPtr set(nftnl_set_alloc());
      if (nftnl_set_elems_nlmsg_parse(nlh, set.get()) < 0) break;
      std::string first;
      nftnl_set_elems_iter* it = nftnl_set_elems_iter_create(set.get());
      if (nftnl_set_elem* e = nftnl_set_elems_iter_next(it)) {
        std::uint32_t len = 0;
        if (const void* key = nftnl_set_elem_get(e, NFTNL_SET_ELEM_KEY, &len)) first = hex(key, len);
      }
      nftnl_set_elems_iter_destroy(it);
      return fmt::format("{} element {} {} {} {{ {} }}", type == NFT_MSG_NEWSETELEM ? "add" : "delete", fam, table,
                         nftnl_set_get_str(set.get(), NFTNL_SET_NAME), first);
    }
    default: break;
  }
  return fmt::format("netlink message type {}", type);
}

/// Other programs' nftables transactions, from the kernel's notifications (NFNLGRP_NFTABLES).
/// A socket filter drops kproxy's own: a transaction's notifications carry its sender's port id
/// and are queued in buffers of that transaction only, so the first message of each decides.
class ForeignWatch {
 public:
  static std::unique_ptr<ForeignWatch> open(std::uint32_t ownPortId, std::string table) {
    mnl_socket* sock = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (sock == nullptr) return nullptr;
    auto watch = std::unique_ptr<ForeignWatch>(new ForeignWatch(sock, std::move(table)));
    const int fd = mnl_socket_get_fd(sock);
    // BPF_ABS loads are big-endian; nlmsg_pid is in host order.
    sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(nlmsghdr, nlmsg_pid)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, htobe32(ownPortId), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, 0),
        BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),
    };
    sock_fprog program{static_cast<unsigned short>(std::size(code)), code};
    int group = NFNLGRP_NFTABLES;
    const int buffer = 4 << 20;  // foreign transactions only; an overflow means "cannot tell"
    if (::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof program) != 0 ||
        mnl_socket_bind(sock, 0, MNL_SOCKET_AUTOPID) != 0 ||
        ::setsockopt(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof group) != 0)
      return nullptr;
    if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
      (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    return watch;
  }
  ~ForeignWatch() { mnl_socket_close(sock_); }

  /// Leaves the group while kproxy commits: without a listener the kernel builds no
  /// notifications of its transactions (thousands in a full sync). Someone else's commit in
  /// that window goes unseen here, but moves the generation past kproxy's own, which the
  /// backend checks after every sync.
  void pause() { membership(NETLINK_DROP_MEMBERSHIP); }
  void resume() { membership(NETLINK_ADD_MEMBERSHIP); }
  ForeignWatch(const ForeignWatch&) = delete;
  ForeignWatch& operator=(const ForeignWatch&) = delete;

  /// Reads the queued notifications. With `until`, waits (up to `patience`) for the one that
  /// ends transaction `until`: the generation moves before a transaction's notifications are
  /// queued. True: one of them touched the ip or ip6 table `table`; nullopt: cannot tell
  /// (notifications were lost, one without a table, or `until` did not come).
  std::optional<bool> drain(std::optional<std::uint32_t> until, std::chrono::milliseconds patience) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    bool touched = false, known = true;
    std::vector<char> buf(64 * 1024);
    for (;;) {
      const ssize_t n = ::recv(mnl_socket_get_fd(sock_), buf.data(), buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == ENOBUFS) {
        known = false;
        continue;
      }
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) return std::nullopt;
        if (!until || reached(*until)) break;
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return std::nullopt;
        pollfd pfd{mnl_socket_get_fd(sock_), POLLIN, 0};
        (void)::poll(&pfd, 1, static_cast<int>(left.count()));
        continue;
      }
      int left = static_cast<int>(n);
      for (auto* m = reinterpret_cast<const nlmsghdr*>(buf.data()); mnl_nlmsg_ok(m, left); m = mnl_nlmsg_next(m, &left))
        note(m, touched, known);
    }
    if (!known) return std::nullopt;
    return touched;
  }

 private:
  ForeignWatch(mnl_socket* sock, std::string table) : sock_(sock), table_(std::move(table)) {}

  void membership(int option) {
    int group = NFNLGRP_NFTABLES;
    (void)::setsockopt(mnl_socket_get_fd(sock_), SOL_NETLINK, option, &group, sizeof group);
  }

  bool reached(std::uint32_t generation) const {
    return lastGeneration_ && static_cast<std::int32_t>(*lastGeneration_ - generation) >= 0;
  }

  void note(const nlmsghdr* m, bool& touched, bool& known) {
    if (NFNL_SUBSYS_ID(m->nlmsg_type) != NFNL_SUBSYS_NFTABLES) return;
    if (m->nlmsg_len < NLMSG_LENGTH(sizeof(nfgenmsg))) {
      known = false;
      return;
    }
    const auto* gen = static_cast<const nfgenmsg*>(mnl_nlmsg_get_payload(m));
    const nlattr* first = nullptr;  // NFTA_GEN_ID, or every object message's table name
    mnl_attr_parse(
        m, sizeof(nfgenmsg),
        [](const nlattr* attr, void* data) -> int {
          if (mnl_attr_get_type(attr) == 1) *static_cast<const nlattr**>(data) = attr;
          return MNL_CB_OK;
        },
        &first);
    if (NFNL_MSG_TYPE(m->nlmsg_type) == NFT_MSG_NEWGEN) {
      if (first != nullptr && mnl_attr_get_payload_len(first) == 4) lastGeneration_ = be32toh(mnl_attr_get_u32(first));
      return;
    }
    if (first == nullptr) {
      known = false;
      return;
    }
    if (gen->nfgen_family != NFPROTO_IPV4 && gen->nfgen_family != NFPROTO_IPV6) return;
    const std::string_view name(static_cast<const char*>(mnl_attr_get_payload(first)),
                                strnlen(static_cast<const char*>(mnl_attr_get_payload(first)),
                                        mnl_attr_get_payload_len(first)));
    if (name == table_) touched = true;
  }

  mnl_socket* sock_;
  const std::string table_;
  std::optional<std::uint32_t> lastGeneration_;
};

/// A transaction encoded as its ops are appended, one buffer per phase (sent together, in
/// phase order, by one sendmsg). Each message records where it is and how many ops it
/// carries; the first kTexts messages also keep the nft text of their first op (a partial
/// sync's batch), later ones are described from their bytes if the kernel refuses them.
class NetlinkBatch final : public KernelBatch {
 public:
  NetlinkBatch(core::Result<kernel::NetlinkSocket*> sock, std::string table, ForeignWatch* watch)
      : sock_(std::move(sock)), table_(std::move(table)), watch_(watch) {
    if (sock_) base_ = (*sock_)->nextSeq(1);
    begin_.commit(nftnl_batch_begin(begin_.tail(), base_));
  }

  void append(std::span<const Op> ops) override {
    for (std::size_t i = 0; i < ops.size();) {
      const std::size_t n = elementRun(ops, i);
      const auto phase = static_cast<std::size_t>(batchPhase(ops[i].kind));
      std::size_t first = phaseOps_[phase];
      if (messages_.size() < kTexts) texts_.push_back(ops[i].toText(table_));
      messages_.push_back(Message{static_cast<std::uint8_t>(phase), static_cast<std::uint32_t>(first),
                                  static_cast<std::uint32_t>(n), phases_[phase].data().size()});
      encodeOp(phases_[phase], table_, ops.subspan(i, n), base_ + static_cast<std::uint32_t>(messages_.size()));
      phaseOps_[phase] += n;
      count_ += n;
      i += n;
    }
  }

  std::size_t size() const override { return count_; }

  core::Result<void> commit() override {
    if (count_ == 0) return {};
    if (!sock_) return std::unexpected(sock_.error());
    const auto messages = static_cast<std::uint32_t>(messages_.size());
    end_.commit(nftnl_batch_end(end_.tail(), base_ + messages + 1));
    (*sock_)->nextSeq(messages + 1);  // the numbers this batch used
    const std::span<const char> parts[] = {begin_.data(), phases_[0].data(), phases_[1].data(),
                                           phases_[2].data(), phases_[3].data(), end_.data()};
    if (watch_ != nullptr) watch_->pause();
    auto failures = (*sock_)->sendBatch(parts);
    if (watch_ != nullptr) watch_->resume();
    if (!failures) return std::unexpected(failures.error());
    if (failures->empty()) return {};
    // The first refusal is the cause; the kernel aborted the whole transaction.
    const auto& f = failures->front();
    const auto count = std::to_string(count_);
    if (f.seq > base_ && f.seq <= base_ + messages) {
      const std::size_t index = f.seq - base_ - 1;
      const Message& bad = messages_[index];
      const std::string text =
          index < texts_.size()
              ? texts_[index]
              : describeMessage(table_, reinterpret_cast<const nlmsghdr*>(phases_[bad.phase].data().data() + bad.offset));
      // Ops are numbered in the order the kernel saw them: by phase.
      std::size_t first = bad.firstInPhase;
      for (std::size_t p = 0; p < bad.phase; ++p) first += phaseOps_[p];
      std::string what = "op " + std::to_string(first + 1) + " of " + count + " \"" + text + "\"";
      if (bad.ops > 1)
        what = "ops " + std::to_string(first + 1) + "-" + std::to_string(first + bad.ops) + " of " + count +
               " (one message, from \"" + text + "\")";
      return makeError(ErrorCategory::kKernel, "nftables: kernel refused " + what, f.errnum);
    }
    return makeError(ErrorCategory::kKernel, "nftables: kernel refused the batch (" + count + " ops)",
                     f.errnum);
  }

 private:
  struct Message {
    std::uint8_t phase = 0;
    std::uint32_t firstInPhase = 0;
    std::uint32_t ops = 0;
    std::size_t offset = 0;  ///< in its phase's buffer
  };
  static constexpr std::size_t kTexts = 4096;
  std::vector<std::string> texts_;  ///< of the first kTexts messages' first ops
  core::Result<kernel::NetlinkSocket*> sock_;
  std::string table_;
  std::uint32_t base_ = 0;
  MessageBuffer begin_, end_;
  MessageBuffer phases_[kBatchPhases];
  std::size_t phaseOps_[kBatchPhases] = {};
  std::vector<Message> messages_;  ///< by sequence number (base + 1 + index)
  std::size_t count_ = 0;
  ForeignWatch* watch_;  ///< paused while the batch commits; may be null
};

class NetlinkKernel final : public KernelNftables {
 public:
  explicit NetlinkKernel(std::string table) : table_(std::move(table)) {}

  core::Result<void> apply(const std::vector<Op>& ops) override {
    if (ops.empty()) return {};
    auto batch = beginBatch();
    batch->append(ops);
    return batch->commit();
  }

  std::unique_ptr<KernelBatch> beginBatch() override { return std::make_unique<NetlinkBatch>(socket(), table_, watch_.get()); }

  core::Result<std::optional<std::uint32_t>> generation() override {
    auto sock = socket();
    if (!sock) return std::unexpected(sock.error());
    // Subscribed before the first generation is read: every later transaction is seen.
    if (!watchTried_) {
      watchTried_ = true;
      watch_ = ForeignWatch::open((*sock)->portId(), table_);
    }
    char req[MNL_SOCKET_BUFFER_SIZE_];
    nlmsghdr* nlh = nftnl_nlmsg_build_hdr(req, NFT_MSG_GETGEN, AF_UNSPEC, NLM_F_ACK, (*sock)->nextSeq());
    std::optional<std::uint32_t> id;
    auto r = (*sock)->dump(nlh, [&](const nlmsghdr* msg) {
      std::unique_ptr<nftnl_gen, decltype(&nftnl_gen_free)> gen(nftnl_gen_alloc(), &nftnl_gen_free);
      if (gen && nftnl_gen_nlmsg_parse(msg, gen.get()) == 0 && nftnl_gen_is_set(gen.get(), NFTNL_GEN_ID))
        id = nftnl_gen_get_u32(gen.get(), NFTNL_GEN_ID);
      return true;
    });
    if (!r) return std::unexpected(r.error());
    return id;
  }

  std::optional<bool> foreignTouched(std::optional<std::uint32_t> until) override {
    if (!watch_) return std::nullopt;
    return watch_->drain(until, std::chrono::milliseconds(200));
  }

  core::Result<Mirror> readBack(const std::vector<SetSpec>& ip4Sets,
                                const std::vector<SetSpec>& ip6Sets) override {
    auto sock = socket();
    if (!sock) return std::unexpected(sock.error());
    Mirror m;
    for (net::Family fam : {net::Family::kIPv4, net::Family::kIPv6}) {
      auto r = readFamily(**sock, fam, fam == net::Family::kIPv4 ? ip4Sets : ip6Sets, m.of(fam));
      if (!r) return std::unexpected(r.error());
    }
    return m;
  }

  core::Result<std::vector<std::pair<std::string, std::string>>> listMap(net::Family fam,
                                                                         const std::string& map) override {
    auto sock = socket();
    if (!sock) return std::unexpected(sock.error());
    std::vector<std::pair<std::string, std::string>> out;
    char req[MNL_SOCKET_BUFFER_SIZE_];
    SetPtr filter = setHandle(table_, fam, map);
    nlmsghdr* nlh =
        nftnl_nlmsg_build_hdr(req, NFT_MSG_GETSETELEM, nfproto(fam), NLM_F_DUMP, (*sock)->nextSeq());
    nftnl_set_elems_nlmsg_build_payload(nlh, filter.get());
    auto r = (*sock)->dump(nlh, [&](const nlmsghdr* msg) {
      SetPtr s(nftnl_set_alloc());
      if (nftnl_set_elems_nlmsg_parse(msg, s.get()) < 0) return false;
      nftnl_set_elems_iter* it = nftnl_set_elems_iter_create(s.get());
      for (nftnl_set_elem* e = nftnl_set_elems_iter_next(it); e != nullptr; e = nftnl_set_elems_iter_next(it)) {
        std::uint32_t klen = 0, dlen = 0;
        const void* key = nftnl_set_elem_get(e, NFTNL_SET_ELEM_KEY, &klen);
        const void* data = nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_DATA)
                               ? nftnl_set_elem_get(e, NFTNL_SET_ELEM_DATA, &dlen)
                               : nullptr;
        if (key == nullptr) continue;
        out.emplace_back(std::string(static_cast<const char*>(key), klen),
                         data ? std::string(static_cast<const char*>(data), dlen) : std::string());
      }
      nftnl_set_elems_iter_destroy(it);
      return true;
    });
    if (!r) {
      if (r.error().errnum == ENOENT) return out;
      return std::unexpected(r.error());
    }
    return out;
  }

  core::Result<void> deleteTables() override {
    auto sock = socket();
    if (!sock) return std::unexpected(sock.error());
    for (net::Family fam : {net::Family::kIPv4, net::Family::kIPv6}) {
      auto deleted = kernel::deleteNftablesTable(**sock, static_cast<std::uint8_t>(nfproto(fam)), table_);
      if (!deleted) return std::unexpected(deleted.error());
    }
    return {};
  }

 private:
  static void out(MessageBuffer& buf, nlmsghdr* nlh) { buf.commit(nlh); }

  core::Result<kernel::NetlinkSocket*> socket() { return kernel::keptSocket(socket_, NETLINK_NETFILTER); }

  core::Result<void> readFamily(kernel::NetlinkSocket& sock, net::Family fam,
                                const std::vector<SetSpec>& specs, MirrorFamily& mf) {
    const std::uint16_t nfp = nfproto(fam);
    auto exists = readTable(sock, nfp);
    if (!exists) return std::unexpected(exists.error());
    if (!*exists) return {};  // nothing of ours in this family
    mf.tableExists = true;
    if (auto r = readChains(sock, nfp, mf); !r) return r;
    if (auto r = readRules(sock, nfp, mf); !r) return r;
    // Sets, then the elements of every set kproxy fills itself.
    if (auto r = readSets(sock, nfp, mf); !r) return r;
    for (const auto& name : mf.sets) {
      bool dynamic = false;
      bool interval = false;
      for (const auto& s : specs)
        if (s.name == name) {
          dynamic = s.dynamic;
          interval = s.interval;
        }
      if (dynamic) continue;
      if (auto r = readElements(sock, fam, name, interval, mf.elements[name]); !r) return r;
    }
    mf.rebuildReferences();
    return {};
  }

  /// Whether the table exists in the family: a plain get, ENOENT meaning no.
  core::Result<bool> readTable(kernel::NetlinkSocket& sock, std::uint16_t nfp) {
    char req[MNL_SOCKET_BUFFER_SIZE_];
    TablePtr t(nftnl_table_alloc());
    nftnl_table_set_str(t.get(), NFTNL_TABLE_NAME, table_.c_str());
    nlmsghdr* nlh = nftnl_nlmsg_build_hdr(req, NFT_MSG_GETTABLE, nfp, NLM_F_ACK, sock.nextSeq());
    nftnl_table_nlmsg_build_payload(nlh, t.get());
    auto r = sock.dump(nlh, [](const nlmsghdr*) { return true; });
    if (!r) {
      if (r.error().errnum == ENOENT) return false;
      return std::unexpected(r.error());
    }
    return true;
  }

  core::Result<void> readChains(kernel::NetlinkSocket& sock, std::uint16_t nfp, MirrorFamily& mf) {
    char req[MNL_SOCKET_BUFFER_SIZE_];
    nlmsghdr* nlh = nftnl_nlmsg_build_hdr(req, NFT_MSG_GETCHAIN, nfp, NLM_F_DUMP, sock.nextSeq());
    return sock.dump(nlh, [&](const nlmsghdr* msg) {
      ChainPtr c(nftnl_chain_alloc());
      if (nftnl_chain_nlmsg_parse(msg, c.get()) < 0) return false;
      const char* table = nftnl_chain_get_str(c.get(), NFTNL_CHAIN_TABLE);
      if (table == nullptr || table_ != table) return true;
      auto& mc = mf.chains[nftnl_chain_get_str(c.get(), NFTNL_CHAIN_NAME)];
      mc.base = nftnl_chain_is_set(c.get(), NFTNL_CHAIN_HOOKNUM);
      return true;
    });
  }

  /// Rules: only their kproxy hash and jump targets, no decoding of matches. One dump per
  /// chain: a table-wide dump restarts its walk over every rule for each 32 KiB reply, which
  /// is quadratic in the table's size; a per-chain dump is a hash lookup plus that chain.
  core::Result<void> readRules(kernel::NetlinkSocket& sock, std::uint16_t nfp, MirrorFamily& mf) {
    char req[MNL_SOCKET_BUFFER_SIZE_];
    for (auto& [chainName, mc] : mf.chains) {
      RulePtr filter(nftnl_rule_alloc());
      nftnl_rule_set_str(filter.get(), NFTNL_RULE_TABLE, table_.c_str());
      nftnl_rule_set_str(filter.get(), NFTNL_RULE_CHAIN, chainName.c_str());
      nlmsghdr* nlh = nftnl_nlmsg_build_hdr(req, NFT_MSG_GETRULE, nfp, NLM_F_DUMP, sock.nextSeq());
      nftnl_rule_nlmsg_build_payload(nlh, filter.get());
      MirrorChain* chain = &mc;
      auto r = sock.dump(nlh, [&](const nlmsghdr* msg) {
        RulePtr rule(nftnl_rule_alloc());
        if (nftnl_rule_nlmsg_parse(msg, rule.get()) < 0) return false;
        const char* table = nftnl_rule_get_str(rule.get(), NFTNL_RULE_TABLE);
        const char* ruleChain = nftnl_rule_get_str(rule.get(), NFTNL_RULE_CHAIN);
        if (table == nullptr || table_ != table || ruleChain == nullptr || chainName != ruleChain)
          return true;
        readRule(rule.get(), *chain);
        return true;
      });
      if (!r) return std::unexpected(r.error());
    }
    return {};
  }

  /// One rule into its chain's mirror: its hash, the chains it jumps or goes to, a balancing
  /// chain's slot range.
  static void readRule(nftnl_rule* rule, MirrorChain& chain) {
    std::uint64_t hash = 0;
    if (nftnl_rule_is_set(rule, NFTNL_RULE_USERDATA)) {
      std::uint32_t len = 0;
      const void* ud = nftnl_rule_get_data(rule, NFTNL_RULE_USERDATA, &len);
      hash = decodeRuleHash(ud, len);
    }
    chain.rules.push_back(hash);
    nftnl_expr_foreach(
        rule,
        [](nftnl_expr* e, void* data) -> int {
          const char* name = nftnl_expr_get_str(e, NFTNL_EXPR_NAME);
          auto* into = static_cast<MirrorChain*>(data);
          if (name != nullptr && std::strcmp(name, "immediate") == 0 &&
              nftnl_expr_is_set(e, NFTNL_EXPR_IMM_CHAIN))
            into->targets.emplace_back(nftnl_expr_get_str(e, NFTNL_EXPR_IMM_CHAIN));
          // The slot range a balancing chain uses (see DnatFromSlots).
          if (name != nullptr && std::strcmp(name, "numgen") == 0 &&
              nftnl_expr_get_u32(e, NFTNL_EXPR_NG_MODULUS) == kSlotsPerRange)
            into->slotBase = nftnl_expr_get_u32(e, NFTNL_EXPR_NG_OFFSET);
          return 0;
        },
        &chain);
  }

  core::Result<void> readSets(kernel::NetlinkSocket& sock, std::uint16_t nfp, MirrorFamily& mf) {
    char req[MNL_SOCKET_BUFFER_SIZE_];
    SetPtr filter(nftnl_set_alloc());
    nftnl_set_set_str(filter.get(), NFTNL_SET_TABLE, table_.c_str());
    nlmsghdr* nlh = nftnl_nlmsg_build_hdr(req, NFT_MSG_GETSET, nfp, NLM_F_DUMP, sock.nextSeq());
    nftnl_set_nlmsg_build_payload(nlh, filter.get());
    return sock.dump(nlh, [&](const nlmsghdr* msg) {
      SetPtr s(nftnl_set_alloc());
      if (nftnl_set_nlmsg_parse(msg, s.get()) < 0) return false;
      const char* table = nftnl_set_get_str(s.get(), NFTNL_SET_TABLE);
      if (table == nullptr || table_ != table) return true;
      mf.sets.insert(nftnl_set_get_str(s.get(), NFTNL_SET_NAME));
      return true;
    });
  }

  /// The elements of one set (key bytes → value text, as the mirror keeps them); an interval
  /// set's keys get their identity suffix back.
  core::Result<void> readElements(kernel::NetlinkSocket& sock, net::Family fam, const std::string& name,
                                  bool interval, ElementTable& elems) {
    char req[MNL_SOCKET_BUFFER_SIZE_];
    std::vector<std::pair<std::string, std::string>> rawIntervals;
    SetPtr filter = setHandle(table_, fam, name);
    nlmsghdr* nlh = nftnl_nlmsg_build_hdr(req, NFT_MSG_GETSETELEM, nfproto(fam), NLM_F_DUMP, sock.nextSeq());
    nftnl_set_elems_nlmsg_build_payload(nlh, filter.get());
    auto r = sock.dump(nlh, [&](const nlmsghdr* msg) {
      SetPtr s(nftnl_set_alloc());
      if (nftnl_set_elems_nlmsg_parse(msg, s.get()) < 0) return false;
      nftnl_set_elems_iter* it = nftnl_set_elems_iter_create(s.get());
      for (nftnl_set_elem* e = nftnl_set_elems_iter_next(it); e != nullptr; e = nftnl_set_elems_iter_next(it)) {
        std::uint32_t len = 0;
        const void* key = nftnl_set_elem_get(e, NFTNL_SET_ELEM_KEY, &len);
        if (key == nullptr) continue;
        std::string value = elementValueText(e);
        std::string keyBytes(static_cast<const char*>(key), len);
        if (interval)
          rawIntervals.emplace_back(std::move(keyBytes), std::move(value));
        else
          elems.set(keyBytes, value);
      }
      nftnl_set_elems_iter_destroy(it);
      return true;
    });
    if (!r) return std::unexpected(r.error());
    // Interval elements get their identity back: a layout is the elements of one 65,536-key
    // range (see renderer.h), and its number of intervals is its number of starts.
    std::unordered_map<std::string, std::uint32_t> starts;
    auto rangeOf = [](const std::string& key) { return key.substr(0, key.size() >= 2 ? 2 : key.size()); };
    for (const auto& [key, value] : rawIntervals)
      if (value != "end") ++starts[rangeOf(key)];
    for (auto& [key, value] : rawIntervals) {
      bool end = value == "end";
      // The end of a range's last interval is its last key, in the same range.
      std::uint32_t intervals = starts[rangeOf(key)];
      elems.set(key + intervalIdentity(end, intervals), value);
    }
    return {};
  }

  /// An element's value as the mirror keeps it: "end" for an interval's end, "=" and the data
  /// bytes, a verdict's text, or nothing.
  static std::string elementValueText(nftnl_set_elem* e) {
    std::string value;
    if (nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_FLAGS) &&
        (nftnl_set_elem_get_u32(e, NFTNL_SET_ELEM_FLAGS) & NFT_SET_ELEM_INTERVAL_END) != 0) {
      value = "end";
    } else if (nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_DATA)) {
      std::uint32_t dlen = 0;
      const void* data = nftnl_set_elem_get(e, NFTNL_SET_ELEM_DATA, &dlen);
      value.reserve(dlen + 1);  // (not "=" + string: GCC 12 -O3 warns, -Wrestrict)
      value.push_back('=');
      value.append(static_cast<const char*>(data), dlen);
    } else if (nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_VERDICT)) {
      const char* chain = nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_CHAIN)
                              ? nftnl_set_elem_get_str(e, NFTNL_SET_ELEM_CHAIN)
                              : nullptr;
      value = verdictText(static_cast<std::int32_t>(nftnl_set_elem_get_u32(e, NFTNL_SET_ELEM_VERDICT)), chain);
    }
    return value;
  }

  static constexpr std::size_t MNL_SOCKET_BUFFER_SIZE_ = 8192;
  const std::string table_;  ///< the table this kernel reads and writes, in both families
  std::optional<kernel::NetlinkSocket> socket_;
  std::unique_ptr<ForeignWatch> watch_;  ///< others' transactions; none when it cannot be opened
  bool watchTried_ = false;
};

}  // namespace

std::unique_ptr<KernelNftables> makeNetlinkKernel(std::string_view table) {
  return std::make_unique<NetlinkKernel>(std::string(table));
}

}  // namespace kproxy::nftables
