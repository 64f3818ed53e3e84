#pragma once
// iptables-nft's rules are nftables rules (native expressions, and xtables matches and targets
// inside `match`/`target` expressions). A backend that wrote them over netlink, as the nftables
// backend writes its own, would commit a full sync in one transaction without the tool's
// --noflush parse. This measures the kernel's half of that design: the IPv4 tables the tool
// built, dumped as they are, sent back as creation messages in one batch into another namespace.

#include <cstddef>
#include <string>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::bench {

/// Creation messages (tables, then chains, then rules in chain order) for every nftables object of
/// family ip in this network namespace, framed for one batch without its begin and end.
struct NftReplay {
  std::vector<char> messages;
  std::size_t tables = 0, chains = 0, rules = 0;
};

/// Dumps this namespace's IPv4 nftables tables, chains and rules into creation messages: the
/// kernel's handles, use counts and rule positions left out, everything else as dumped, plus
/// what the kernel checks xtables expressions with but does not dump (NFTA_RULE_COMPAT: the
/// protocol of the rule's `meta l4proto` comparison), as iptables-nft sends it.
core::Result<NftReplay> dumpIpv4Ruleset();

/// Sends `replay` as one transaction in this namespace (BATCH_BEGIN ... BATCH_END, one sendmsg).
core::Result<void> sendReplay(const NftReplay& replay);

}  // namespace kproxy::bench
