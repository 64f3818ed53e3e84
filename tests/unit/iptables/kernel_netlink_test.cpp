// NftRuleBatch without a kernel: which rule specs it encodes, and that a refusal leaves the
// batch as it was. Whether its encoding is iptables-nft's is tests/kernel's question.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "iptables_fixtures.h"
#include "kproxy/iptables/kernel_netlink.h"
#include "kproxy/iptables/renderer.h"

using namespace kproxy;
using namespace kproxy::iptables;

TEST_CASE("nft rules: every nat rule the renderer writes is encoded, in both families", "[unit]") {
  plan::VectorSnapshot snap(testing::allFeatureServices(), testing::featureNode());
  snap.setServiceCIDRs({{"kubernetes", "172.30.0.0/16"}, {"kubernetes", "fd00:30::/108"}});
  for (net::Family f : {net::Family::kIPv4, net::Family::kIPv6}) {
    for (bool large : {false, true}) {
      IptablesRenderer r(testing::featureConfig());
      r.setNode(snap.node());
      r.setServiceCIDRs(snap.serviceCIDRs());
      r.setLargeCluster(large);
      std::size_t rules = 0;
      for (const auto& [key, specs] : testing::chainsOf(renderRuleset(r, f, snap.ports(), snap.node()), true)) {
        if (key.first != "nat") continue;
        for (const auto& spec : specs) {
          INFO(key.second << ": " << spec);
          auto checked = checkNftRuleSpec(f, spec);
          INFO((checked ? std::string() : checked.error().message()));
          CHECK(checked.has_value());
          ++rules;
        }
      }
      CHECK(rules > 40);
    }
  }
}

TEST_CASE("nft rules: shapes iptables-nft would encode otherwise are refused, naming the word", "[unit]") {
  const net::Family v4 = net::Family::kIPv4;
  struct Case {
    const char* spec;
    const char* names;
  };
  const Case cases[] = {
      {"-m multiport --dports 80,443 -j KUBE-SVC-X", "-m multiport"},
      {"-p tcp -m tcp --sport 80 -j KUBE-SVC-X", "--sport"},
      {"-p tcp -m tcp --dport 80:90 -j KUBE-SVC-X", "--dport"},
      {"-o eth0 -j KUBE-SVC-X", "-o"},
      {"-s fd00::1/128 -j KUBE-SVC-X", "-s fd00::1/128"},
      {"-j SNAT --to-source 10.0.0.1", "-j SNAT"},
      {"-j DNAT --to-destination 10.0.0.1", "-j DNAT"},
      {"-j MARK --or-mark 0x4000", "-j MARK"},
      {"-m statistic --mode nth --every 2 -j KUBE-SEP-X", "--mode"},
      {"-m addrtype --src-type UNICAST -j KUBE-SVC-X", "--src-type"},
      {"-j my-chain", "-j my-chain"},
      {"-p icmp -j KUBE-SVC-X", "-p icmp"},
      {"-m comment --comment \"x\" ! -j KUBE-SVC-X", "-j"},
  };
  for (const auto& c : cases) {
    INFO(c.spec);
    auto checked = checkNftRuleSpec(v4, c.spec);
    REQUIRE_FALSE(checked.has_value());
    INFO(checked.error().message());
    CHECK(checked.error().message().find(c.names) != std::string::npos);
  }
  // And a few the renderer writes, for contrast.
  CHECK(checkNftRuleSpec(v4, "-p tcp -m comment --comment \"a b\" -m tcp -j DNAT --to-destination 10.1.0.1:80"));
  CHECK(checkNftRuleSpec(net::Family::kIPv6, "-p udp -m udp -j DNAT --to-destination [fd00::1]:53"));
  CHECK(checkNftRuleSpec(v4, "! -i veth+ -d 172.30.0.1/32 -p sctp -m sctp --dport 9 -j KUBE-MARK-MASQ"));
}

TEST_CASE("nft rules: a chain with a rule it cannot encode leaves the batch as it was", "[unit]") {
  NftRuleBatch batch(net::Family::kIPv4);
  const std::vector<std::string> good{"-s 10.1.0.1/32 -j KUBE-MARK-MASQ",
                                      "-p tcp -m tcp -j DNAT --to-destination 10.1.0.1:80"};
  const std::vector<std::string> bad{"-j KUBE-MARK-MASQ", "-m set --match-set X src -j ACCEPT"};
  const NftChainRewrite first[] = {{"KUBE-SEP-A", good}};
  REQUIRE(batch.add(first).has_value());
  const auto bytes = batch.messages().size();
  CHECK(batch.rules() == 2);
  CHECK(batch.chains() == 1);
  const NftChainRewrite second[] = {{"KUBE-SEP-B", good}, {"KUBE-SVC-B", bad}};
  auto refused = batch.add(second);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message().find("chain KUBE-SVC-B") != std::string::npos);
  CHECK(refused.error().message().find("-m set") != std::string::npos);
  CHECK(batch.messages().size() == bytes);
  CHECK(batch.rules() == 2);
  CHECK(batch.chains() == 1);
}
