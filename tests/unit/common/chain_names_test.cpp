#include "kproxy/backends/common/chain_names.h"

#include <catch2/catch.hpp>

using namespace kproxy::backends;

TEST_CASE("base32 of sha256 matches RFC 4648 encoding", "[unit]") {
  // Python: base64.b32encode(hashlib.sha256(b"abc").digest())
  CHECK(base32Sha256Prefix("abc", 52) == "XJ4BNP4PAHH6UQKBIDPF3LRCEOYAGYNDSYLXVHFUCD7WD4QACWWQ");
  CHECK(base32Sha256Prefix("", 8) == "4OYMIQUY");
  CHECK(base32Sha256Prefix("abc", 100).size() == 52);
  CHECK(base32Sha256Prefix("abc", 0).empty());
}

TEST_CASE("nftables names hash as upstream's hashAndTruncate", "[unit]") {
  CHECK(nftablesHashAndTruncate("ns1/svc1/tcp/p80") == "ULMVA6XW-ns1/svc1/tcp/p80");
  const std::string longName(300, 'x');
  const auto truncated = nftablesHashAndTruncate(longName);
  CHECK(truncated.size() == 240);
  CHECK(truncated.ends_with("..."));
  CHECK(truncated.starts_with(base32Sha256Prefix(longName, 8) + "-xxx"));
}

TEST_CASE("service port names and endpoints are written as upstream's String()", "[unit]") {
  CHECK(servicePortNameString("ns1", "svc1", "p80") == "ns1/svc1:p80");
  CHECK(servicePortNameString("ns1", "svc1", "") == "ns1/svc1");
  CHECK(endpointHostPort("10.180.0.1", 80) == "10.180.0.1:80");
  CHECK(endpointHostPort("fd00:10:180::1", 8080) == "[fd00:10:180::1]:8080");
}

// Expected values are those of upstream's pkg/proxy/iptables/proxier_test.go.
TEST_CASE("iptables service chains hash as upstream's portProtoHash", "[unit]") {
  CHECK(portProtoHash("ns1/svc1:p80", "tcp") == "XPGD46QRK7WJZT7O");
  CHECK(servicePortPolicyClusterChain("ns1/svc1:p80", "tcp") == "KUBE-SVC-XPGD46QRK7WJZT7O");
  CHECK(servicePortPolicyClusterChain("ns2/svc2:p80", "tcp") == "KUBE-SVC-GNZBNJ2PO5MGZ6GT");
  CHECK(servicePortPolicyLocalChain("ns2/svc2:p80", "tcp") == "KUBE-SVL-GNZBNJ2PO5MGZ6GT");
  CHECK(serviceExternalChain("ns2/svc2:p80", "tcp") == "KUBE-EXT-GNZBNJ2PO5MGZ6GT");
  CHECK(serviceFirewallChain("ns2/svc2:p80", "tcp") == "KUBE-FW-GNZBNJ2PO5MGZ6GT");
  // The protocol is part of the hash.
  CHECK(servicePortPolicyClusterChain("ns1/svc1:p80", "udp") == "KUBE-SVC-OJWW7NSBVZTDHXNW");
  // Every name fits iptables' 28-character limit.
  CHECK(serviceExternalChain("a-very-long-namespace/a-very-long-service:port", "sctp").size() <= 28);
}

TEST_CASE("iptables endpoint chains hash as upstream's servicePortEndpointChainName", "[unit]") {
  CHECK(servicePortEndpointChain("ns1/svc1:p80", "tcp", "10.180.0.1:80") == "KUBE-SEP-SXIVWICOYRO3J4NJ");
  CHECK(servicePortEndpointChain("ns1/svc1:p80", "tcp", endpointHostPort("10.180.0.2", 80)) ==
        "KUBE-SEP-LXVODXWDISEETFEF");
  CHECK(servicePortEndpointChain("ns2/svc2:p80", "tcp", "10.180.0.2:80") == "KUBE-SEP-RS4RBKLTHTF2IUXJ");
  CHECK(servicePortEndpointChain("ns3/svc3:p80", "tcp", "10.180.0.3:80") == "KUBE-SEP-OYPFS5VJICHGATKP");
  CHECK(servicePortEndpointChain("ns4/svc4:p80", "tcp", "10.180.0.4:80") == "KUBE-SEP-UKSFD7AGPMPPLUHC");
}

TEST_CASE("fixed chains and service chain prefixes", "[unit]") {
  CHECK(iptables_chains::kServices == "KUBE-SERVICES");
  CHECK(iptables_chains::kNodePorts == "KUBE-NODEPORTS");
  CHECK(iptables_chains::kPostrouting == "KUBE-POSTROUTING");
  CHECK(iptables_chains::kMarkMasq == "KUBE-MARK-MASQ");
  CHECK(iptables_chains::kProxyFirewall == "KUBE-PROXY-FIREWALL");
  CHECK(iptables_chains::kExternalServices == "KUBE-EXTERNAL-SERVICES");
  CHECK(iptables_chains::kForward == "KUBE-FORWARD");
  CHECK(iptables_chains::kProxyCanary == "KUBE-PROXY-CANARY");
  CHECK(isServiceChainName("KUBE-SVC-XPGD46QRK7WJZT7O"));
  CHECK(isServiceChainName("KUBE-SEP-SXIVWICOYRO3J4NJ"));
  CHECK(isServiceChainName("KUBE-FW-GNZBNJ2PO5MGZ6GT"));
  CHECK_FALSE(isServiceChainName("KUBE-SERVICES"));
  CHECK_FALSE(isServiceChainName("KUBE-XLB-GNZBNJ2PO5MGZ6GT"));
}
