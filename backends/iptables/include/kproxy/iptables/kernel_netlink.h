#pragma once
/// iptables-nft's rules written over netlink, for the full sync's owned nat chains: the same
/// nftables objects `iptables-nft-restore` (1.8) creates from the same rule specs, encoded
/// here and sent as one transaction, without the tool's parse of the text and without a kernel
/// commit per chunk of 2,000 rules. The rule specs are the backend's own restore text (what
/// `--dry-run` prints and the mirror hashes); only the shapes the renderer writes are encoded,
/// exactly as iptables-nft encodes them (native payload / meta comparisons where it uses them,
/// xtables match and target expressions elsewhere), and anything else is refused, so that
/// the caller hands that chain to the tool instead. `iptables-nft-save` reads these rules back
/// as the tool's own; tests/kernel compares the kernel's dumps of both byte for byte.
/// Thread-safety: one owner.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/kernel/message_buffer.h"
#include "kproxy/kernel/netlink_socket.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::iptables {

/// One chain to (re)write: created when missing, emptied, then given `rules` (specs as in
/// `-A CHAIN SPEC`).
struct NftChainRewrite {
  std::string_view name;
  std::span<const std::string> rules;
};

class NftRuleBatch {
 public:
  /// Chains of `table` ("nat") of `family`'s table (ip or ip6). The table must exist when the
  /// batch is committed (iptables-nft creates it, with its base chains, on its first restore).
  explicit NftRuleBatch(net::Family family, std::string table = "nat");

  /// Appends the rewrites of `chains`: every chain's creation and flush first, then their
  /// rules, so rules may jump to any of them. All or nothing: an error names the first rule
  /// of a shape this encoder does not write, and the batch is as it was.
  core::Result<void> add(std::span<const NftChainRewrite> chains);
  /// Appends the deletion of chains `names`: each emptied, then deleted (after whatever the
  /// batch holds before, so rules rewritten there no longer jump to them).
  void remove(std::span<const std::string_view> names);

  /// Room for about `rules` rules (only the pages written are resident).
  void reserve(std::size_t rules) { messages_.reserve(rules * kBytesPerRule); }

  std::size_t rules() const { return rules_; }
  std::size_t chains() const { return chains_; }
  bool empty() const { return messages_.empty(); }
  /// The encoded messages, without the batch's begin and end (tests).
  std::span<const char> messages() const { return messages_.data(); }

  /// Sends the batch as one nfnetlink transaction on `socket` and empties it. The kernel
  /// applies all of it or, when it refuses any message, nothing; the error then names the
  /// chain and rule it refused. Keep the socket for the next transaction: closing a netfilter
  /// socket waits for the kernel to release what the last commit replaced (an RCU grace
  /// period), which a socket per commit adds to every change. Measured: BENCHMARKS.md,
  /// "Figures behind the code".
  core::Result<void> commit(kernel::NetlinkSocket& socket);
  /// The same on a socket of its own, opened in the calling thread's network namespace.
  core::Result<void> commit();

 private:
  /// A service rule's messages average about 300 bytes (the comment match alone is 256).
  static constexpr std::size_t kBytesPerRule = 320;
  struct Sent {
    std::uint32_t chain = 0;  ///< index in names_
    std::uint32_t rule = 0;   ///< 0: the chain's creation or flush; else the rule's 1-based number
  };
  /// Appends a message about chain names_[index]: NFT_MSG_NEWCHAIN, NFT_MSG_DELCHAIN, or
  /// NFT_MSG_DELRULE (its flush).
  void chainMessage(std::uint16_t type, std::uint16_t flags, std::uint32_t index);

  net::Family family_;
  std::string table_;
  kernel::MessageBuffer messages_;
  std::vector<Sent> sent_;  ///< per message, in order
  std::vector<std::string> names_;
  std::size_t rules_ = 0, chains_ = 0;
};

/// Whether `spec` (a rule of `family`) is of a shape NftRuleBatch writes; the error says why
/// not. For tests and for choosing the tool up front.
core::Result<void> checkNftRuleSpec(net::Family family, std::string_view spec);

}  // namespace kproxy::iptables
