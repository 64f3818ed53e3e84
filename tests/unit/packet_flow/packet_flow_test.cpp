// Upstream kube-proxy's packet-flow tables (pkg/proxy/nftables/proxier_test.go, and the
// tables of pkg/proxy/iptables/proxier_test.go the nftables file has no twin of:
// runPacketFlowTests), answered by `kproxy explain`'s path, by every backend that can explain:
// core model objects → ChangeTracker snapshot → the built plugin (kproxy-backend-nftables.so,
// kproxy-backend-iptables.so, loaded by the real PluginRegistry, created with the scenario's
// options and dry-run=true) → its explain entry point with KPROXY_EXPLAIN_JSON → the JSON
// answer. Every table runs once per backend (test cases tagged [nftables] / [iptables] / [ipvs] /
// [userspace] / [ebpf]), so the backends are held to the same answers. Where a mode cannot mean
// what upstream's row says, the row holds it to its own answer under a one-line reason, counted
// per mode and printed at the end of the run ("per-mode known differences" below): the
// userspace mode relays from the node (so what it relays counts as masqueraded) and carries no
// SCTP; ebpf mode NATs nothing at its sockets, refuses where the plan drops, leaves unsteered
// what it has no element for, and serves no ClusterIP to clients on other hosts (those meet its
// nftables part, which answers as nftables mode otherwise). Nothing else differs.
// The inputs (services, endpoint slices, node name and addresses, cluster CIDR,
// nodeport-addresses) and the expected answers are upstream's; the tables are written anew.
// The rows are those of Kubernetes v1.34.4: module k8s.io/kubernetes@v1.34.4 from the Go module
// proxy, h1:Yy6R4QB8C9kJPp25GFqEvX5XQwY5qzKeqD0Xx6oAcmk= (the build the project uses for its e2e
// tests and benchmarks: K8S_VERSION in tests/e2e/build-control-plane.sh), files
// pkg/proxy/nftables/proxier_test.go and pkg/proxy/iptables/proxier_test.go; each table below
// names its upstream test function. The two TestOnlyLocalNodePorts tables are older: upstream
// removed them in v1.29.0; they are those of k8s.io/kubernetes@v1.28.0,
// h1:p8qq/VoNHnBWinLEi5LO2IvCfzFouN7Jhdz8+L++V+U=, pkg/proxy/iptables/proxier_test.go.
//
// Only outcomes are compared (endpoint set, DROP / REJECT / untouched, masquerade); kproxy's
// nftables rules are shaped differently on purpose (no endpoint chains, slot maps), its
// iptables rules are upstream's layout. The answer's endpoint list must agree with its outcome
// (the endpoints marked "selected" are the DNAT set).
//
// The rows where kproxy used to answer otherwise than upstream (the eTP=Local short-circuit
// without local endpoints, source ranges admitting the node, masquerade-all and the
// short-circuit, dropping unallocated ClusterIPs) name the behaviour (Known) and run in their
// own test cases (", known differences", tagged [known-difference]); they are checked like
// every other row. As upstream's fake proxier, every scenario has the ServiceCIDR objects of
// 172.30.0.0/16 and fd00:10:96::/112. Where kproxy deliberately answers otherwise than upstream
// (README, "Meaning the same as kube-proxy"), the row asserts kproxy's documented answer and is
// marked Known::kDeliberate.
//
// A test case is registered only for a table and kind that has rows, and fails unless it
// checked every one of them.
//
// Upstream traces every packet as arriving on an interface; here a packet whose source is one
// of the node's addresses is sent by the node (output path), as it would be in reality.

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
// The listener that prints the per-mode known differences (ModeDifferenceReport).
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kproxy/core/nodeport_addresses.h"
#include "kproxy/core/tracker.h"
#include "kproxy/plugin/sdk.h"
#include "kproxy/plugins/loader.h"
#include "snapshot_bridge.h"

using namespace kproxy;

namespace {

// Upstream's conventions (NewFakeProxier).
constexpr const char* kNodeName = "test-node";
constexpr const char* kNodeIP = "192.168.0.2";
constexpr const char* kNodeIPAlt = "192.168.1.2";
constexpr const char* kExternalIP = "192.168.99.11";  // also an address of the node
constexpr const char* kNodeIPv6 = "2001:db8::1";
constexpr const char* kNodeIPv6Alt = "2001:db8:1::2";
constexpr const char* kExternalClient = "203.0.113.2";
constexpr const char* kExternalClientBlocked = "203.0.113.130";
const std::vector<std::string> kNodeIPs{kNodeIP, kNodeIPAlt, kExternalIP, kNodeIPv6, kNodeIPv6Alt};

/// The behaviour a row holds kproxy to where its answer once differed from upstream's, or
/// differs on purpose.
enum class Known {
  kNone,
  kLocalShortCircuit,           // eTP=Local without local endpoints: pod / node traffic short-circuits
  kSourceRangesAdmitNode,       // loadBalancerSourceRanges holding a node IP admit the node's traffic
  kShortCircuitNotMasqueraded,  // --masquerade-all does not masquerade the eTP=Local short-circuit
  kUnallocatedClusterIPDropped, // ServiceCIDRs: a ClusterIP no Service holds is dropped
  // A case upstream's tables do not have, asserting kproxy's answer where the README says it
  // deliberately differs from upstream's nftables mode.
  kDeliberate,
};

struct FlowCase {
  std::string name;
  std::string source;
  std::string destination;
  int port = 0;
  std::string output;  // upstream's: "ip:port, …", "DROP", "REJECT", or "" (untouched)
  bool masq = false;
  std::string protocol = "tcp";
  Known known = Known::kNone;
  /// Modes whose answer is another (output, masq): where the mode's own default decides (no
  /// --nodeport-addresses), as upstream's modes differ there; or, with `why`, where the mode
  /// cannot mean what upstream's row says (a per-mode known difference, counted and printed).
  struct ModeAnswer {
    std::string mode;
    std::string output;
    bool masq = false;
    const char* why = nullptr;
  };
  std::vector<ModeAnswer> outputIn = {};
  /// ebpf mode has no element for the destination (a LoadBalancer IP behind
  /// loadBalancerSourceRanges): the node's or pod's connect goes out unchanged and meets the
  /// nftables part, which answers as nftables mode (NAT included).
  bool unsteeredInEbpf = false;
};

/// Objects applied to the tracker, then the cases traced over the published snapshot.
struct Phase {
  std::function<void(core::ChangeTracker&)> apply;
  std::vector<FlowCase> cases;
};


struct Scenario {
  std::vector<std::string> clusterCIDRs{"10.0.0.0/8"};
  bool masqueradeAll = false;
  std::vector<std::string> nodePortAddresses{std::string(kNodeIP) + "/32", std::string(kNodeIPv6) + "/128"};
  /// No --nodeport-addresses: each mode gets its default (core::defaultNodePortAddresses), as
  /// kproxy's flags give it, in place of nodePortAddresses.
  bool nodePortAddressesUnset = false;
  std::string bindAddress;  ///< --bind-address; "" for the default
  /// The node's interface addresses, read by the running daemon (upstream's fake interfaces:
  /// the node IPs, and loopback). nullopt: none read, as in `kproxy explain`, which decides
  /// from the Node object's addresses.
  std::optional<std::vector<std::string>> interfaceAddresses = interfacesWith({});
  std::vector<Phase> phases;

  static std::vector<std::string> interfacesWith(std::vector<std::string> more) {
    std::vector<std::string> out = kNodeIPs;
    out.insert(out.end(), {"127.0.0.1", "::1"});
    out.insert(out.end(), more.begin(), more.end());
    return out;
  }
};

// ---- model builders ----------------------------------------------------------------------

net::Family familyOf(const std::string& ip) {
  return ip.find(':') == std::string::npos ? net::Family::kIPv4 : net::Family::kIPv6;
}

core::ServicePortSpec port(std::string name, std::int32_t number, std::int32_t nodePort = 0,
                           core::Protocol protocol = core::Protocol::kTCP) {
  core::ServicePortSpec p;
  p.name = std::move(name);
  p.protocol = protocol;
  p.port = number;
  p.targetPort.number = number;
  p.nodePort = nodePort;
  return p;
}

core::Service service(std::string ns, std::string name, std::string clusterIP, std::vector<core::ServicePortSpec> ports,
                      const std::function<void(core::Service&)>& edit = {}) {
  core::Service s;
  s.ns = std::move(ns);
  s.name = std::move(name);
  s.resourceVersion = "1";
  s.ipFamilies = {familyOf(clusterIP)};
  s.clusterIPs = {std::move(clusterIP)};
  s.ports = std::move(ports);
  if (edit) edit(s);
  return s;
}

void loadBalancer(core::Service& s, std::vector<std::string> ips) {
  s.type = core::ServiceType::kLoadBalancer;
  for (auto& ip : ips) s.loadBalancerIngress.push_back(core::LoadBalancerIngress{std::move(ip), {}, {}});
}

core::EndpointPort slicePort(std::string name, std::int32_t number, core::Protocol protocol = core::Protocol::kTCP) {
  core::EndpointPort p;
  p.name = std::move(name);
  p.port = number;
  p.protocol = protocol;
  return p;
}

struct Conditions {
  std::optional<bool> ready, serving, terminating;
};

core::SliceEndpoint sliceEndpoint(std::string ip, std::optional<std::string> node = std::nullopt,
                                  Conditions c = {}) {
  core::SliceEndpoint e;
  e.addresses = {std::move(ip)};
  e.nodeName = std::move(node);
  e.conditions.ready = c.ready;
  e.conditions.serving = c.serving;
  e.conditions.terminating = c.terminating;
  return e;
}
const Conditions kReady{true, true, false};
const Conditions kServingTerminating{false, true, true};
const Conditions kTerminating{false, false, true};

core::EndpointSlice slice(std::string ns, std::string serviceName, std::vector<core::EndpointPort> ports,
                          std::vector<core::SliceEndpoint> endpoints, int number = 1) {
  core::EndpointSlice s;
  s.ns = std::move(ns);
  s.name = fmt::format("{}-{}", serviceName, number);
  s.serviceName = serviceName;
  s.labels[core::kLabelServiceName] = serviceName;
  s.resourceVersion = "1";
  s.addressType = !endpoints.empty() && familyOf(endpoints.front().addresses.front()) == net::Family::kIPv6
                      ? core::AddressType::kIPv6
                      : core::AddressType::kIPv4;
  s.ports = std::move(ports);
  s.endpoints = std::move(endpoints);
  return s;
}

core::Node testNode() {
  core::Node n;
  n.name = kNodeName;
  n.resourceVersion = "1";
  // kproxy reads no interfaces: the Node's addresses stand in for the addresses of upstream's
  // fake interfaces, and nodeport-addresses selects among them.
  for (const auto& ip : kNodeIPs) n.addresses.push_back(core::NodeAddress{"InternalIP", ip});
  return n;
}

// ---- running ---------------------------------------------------------------------------------

std::string knownText(Known k) {
  switch (k) {
    case Known::kNone: return "";
    case Known::kLocalShortCircuit: return "eTP=Local short-circuit without local endpoints";
    case Known::kSourceRangesAdmitNode: return "source ranges holding a node IP admit the node";
    case Known::kShortCircuitNotMasqueraded: return "--masquerade-all leaves the eTP=Local short-circuit alone";
    case Known::kUnallocatedClusterIPDropped: return "unallocated ClusterIP in a ServiceCIDR dropped";
    case Known::kDeliberate: return "kproxy's answer; README: deliberately differs from upstream";
  }
  return "";
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

std::vector<std::string> splitOutput(const std::string& output) {
  std::vector<std::string> parts;
  if (output.empty() || output == "DROP" || output == "REJECT") return parts;
  std::size_t start = 0;
  while (start <= output.size()) {
    auto comma = output.find(", ", start);
    if (comma == std::string::npos) comma = output.size();
    parts.push_back(output.substr(start, comma - start));
    start = comma + 2;
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

/// Upstream's output as our outcome text: endpoints sorted, so both sides compare as sets.
std::string normalized(const std::string& output) {
  if (output.empty() || output == "DROP" || output == "REJECT") return output;
  std::string out;
  for (const auto& p : splitOutput(output)) out += (out.empty() ? "" : ", ") + p;
  return out;
}

/// The answer's outcome in upstream's words: "ip:port, …", "DROP", "REJECT", or "".
std::string outcomeText(const nlohmann::json& answer) {
  const std::string verdict = answer.at("verdict").get<std::string>();
  if (verdict == "drop") return "DROP";
  if (verdict == "reject") return "REJECT";
  if (verdict == "accept") return "";
  std::vector<std::string> endpoints = answer.at("outcome").at("endpoints").get<std::vector<std::string>>();
  std::sort(endpoints.begin(), endpoints.end());
  std::string out;
  for (const auto& e : endpoints) out += (out.empty() ? "" : ", ") + e;
  return out;
}

// ---- per-mode known differences ------------------------------------------------------------
//
// Where a mode cannot mean what upstream's row says, the row is checked against the mode's own
// answer and counted under a one-line reason; the run prints the count per mode and reason.
// Rows name their own (FlowCase::ModeAnswer::why); the rest follow from how the mode works
// and apply to every row alike (modeRule).

// The userspace proxy relays every connection from the node (README).
constexpr const char* kUserspaceFromNode = "the proxy relays from the node: the client's source is never kept";
constexpr const char* kUserspaceNoSCTP = "the proxy carries no SCTP";
// ebpf mode: the socket hooks (README, "The ebpf mode").
// What is not a socket of this node (neither the node's nor in the cluster CIDR) meets the
// nftables part, which answers as nftables mode but for ClusterIPs.
constexpr const char* kEbpfClusterIPFromOutside =
    "a client that is not a socket of this node is not served a TCP or UDP ClusterIP: the nftables part has no "
    "ClusterIP dispatch for them and rejects it";
constexpr const char* kEbpfNoNat = "nothing is NATed: a steered socket keeps its own source address";
constexpr const char* kEbpfRefusedNotDropped =
    "a socket cannot be dropped: the plan's drop (no endpoint in the policy's pool) is ECONNREFUSED";

/// NewFakeProxier's service CIDRs: every ClusterIP of the tables is in them.
const std::vector<std::string> kServiceCIDRs{"172.30.0.0/16", "fd00:10:96::/112"};

/// Rows checked against a mode's own answer: mode → reason → rows.
std::map<std::string, std::map<std::string, std::size_t>>& modeDifferences() {
  static std::map<std::string, std::map<std::string, std::size_t>> counted;
  return counted;
}

/// The rows each mode checked.
std::map<std::string, std::size_t>& rowsChecked() {
  static std::map<std::string, std::size_t> counted;
  return counted;
}

struct ModeExpectation {
  std::string output;
  bool masq = false;
  const char* why = nullptr;  ///< set when this is the mode's answer, not upstream's
};

bool inAny(const std::vector<std::string>& cidrs, const std::string& ip) {
  auto address = net::Prefix::parse(ip);
  return address && std::any_of(cidrs.begin(), cidrs.end(), [&](const std::string& c) {
           auto cidr = net::Prefix::parse(c);
           return cidr && cidr->family == address->family && cidr->contains(*address);
         });
}

/// The differences that follow from how `mode` works, applied to upstream's answer `want` (a
/// rule that would not change it is no difference).
ModeExpectation modeRule(const std::string& mode, const Scenario& scenario, const FlowCase& c, bool fromNode,
                         ModeExpectation want) {
  const bool forwarded = !splitOutput(want.output).empty();
  if (mode == "userspace") {
    if (c.protocol == "sctp") return {"", false, kUserspaceNoSCTP};
    if (forwarded && !want.masq) return {want.output, true, kUserspaceFromNode};
  }
  if (mode == "ebpf") {
    // Explain takes the node's addresses for the node, and the cluster CIDR for its pods (the
    // local-traffic detector); anything else arrives from another host, at the nftables part.
    if (!fromNode && !inAny(scenario.clusterCIDRs, c.source)) {
      if (forwarded && inAny(kServiceCIDRs, c.destination) && c.protocol != "sctp")
        return {"REJECT", false, kEbpfClusterIPFromOutside};
      return want;
    }
    // A connect the hooks leave unchanged (no element, not TCP or UDP) meets the nftables part too.
    if (c.unsteeredInEbpf) return want;
    // The hooks steer TCP and UDP only: an SCTP connect meets the nftables part, which
    // dispatches SCTP ClusterIPs as nftables mode does.
    if (c.protocol == "sctp") return want;
    if (forwarded && want.masq) return {want.output, false, kEbpfNoNat};
  }
  return want;
}

/// Prints, at the end of the run, how many rows each mode answered in its own way, and why.
class ModeDifferenceReport final : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats& stats) override {
    if (!rowsChecked().empty()) {
      std::string out = "packet flow: rows answered with a mode's known difference (of the rows checked):\n";
      for (const auto& [mode, rows] : rowsChecked()) {
        std::size_t total = 0;
        for (const auto& [why, n] : modeDifferences()[mode]) total += n;
        out += fmt::format("  {}: {} of {}\n", mode, total, rows);
        for (const auto& [why, n] : modeDifferences()[mode]) out += fmt::format("    {:>4}  {}\n", n, why);
      }
      std::fputs(out.c_str(), stdout);
    }
    TestEventListenerBase::testRunEnded(stats);
  }
};

}  // namespace
CATCH_REGISTER_LISTENER(ModeDifferenceReport)
namespace {

/// The built backend plugins, loaded once by the loader `kproxy` uses. The registry outlives
/// every backend created from it (a function-local static, destroyed after the tests).
plugins::PluginRegistry& backendPlugins() {
  static plugins::PluginRegistry registry;
  static const bool loaded = [] {
    for (const char* path : {KPROXY_NFTABLES_PLUGIN, KPROXY_IPTABLES_PLUGIN, KPROXY_IPVS_PLUGIN, KPROXY_USERSPACE_PLUGIN
#ifdef KPROXY_EBPF_PLUGIN
                             ,
                             KPROXY_EBPF_PLUGIN
#endif
         }) {
      auto info = registry.load(path);
      if (!info) FAIL("cannot load " << path << ": " << info.error().message());
    }
    return true;
  }();
  (void)loaded;
  return registry;
}

/// The backend as `kproxy explain --proxy-mode <mode>` creates it for the scenario's flags.
std::vector<std::string> nodePortSpec(const Scenario& scenario, const std::string& mode) {
  return scenario.nodePortAddressesUnset ? core::defaultNodePortAddresses(mode) : scenario.nodePortAddresses;
}

std::unique_ptr<plugins::PluginBackend> explainingBackend(const Scenario& scenario, const std::string& mode) {
  plugins::BackendOptions options;
  options["node-name"] = kNodeName;
  options["cluster-cidr"] = joined(scenario.clusterCIDRs);
  options["detect-local-mode"] = "ClusterCIDR";
  options["masquerade-all"] = scenario.masqueradeAll ? "true" : "false";
  options["nodeport-addresses"] = joined(nodePortSpec(scenario, mode));
  if (!scenario.bindAddress.empty()) options["node-ips"] = scenario.bindAddress;
  options["dry-run"] = "true";  // explain never touches the kernel; neither does the test
  auto backend = backendPlugins().createPluginBackend(mode, options);
  REQUIRE(backend);
  REQUIRE((*backend)->canExplain());
  return std::move(*backend);
}

/// Every mode the table runs in.
std::vector<std::string> explainingModes() {
  std::vector<std::string> modes{"nftables", "iptables", "ipvs", "userspace"};
#ifdef KPROXY_EBPF_PLUGIN
  modes.push_back("ebpf");
#endif
  return modes;
}

enum class Selection { kAgreed, kKnownDifferences };

/// The rows of `scenario` of one kind.
std::size_t rowsOf(const Scenario& scenario, Selection selection) {
  std::size_t n = 0;
  for (const auto& p : scenario.phases)
    for (const auto& c : p.cases) n += (selection == Selection::kKnownDifferences) == (c.known != Known::kNone);
  return n;
}

/// Traces the rows of one kind through `mode`'s backend; returns how many it checked.
std::size_t runScenario(const Scenario& scenario, Selection selection, const std::string& mode) {
  std::size_t checked = 0;
  core::TrackerConfig trackerConfig;
  trackerConfig.nodeName = kNodeName;
  trackerConfig.nodePortAddresses = nodePortSpec(scenario, mode);
  trackerConfig.bindAddress = scenario.bindAddress;
  core::ChangeTracker tracker(trackerConfig);
  tracker.upsertNode(testNode());
  // As kproxy runs: NodePort addresses decided against the node's interface addresses, or,
  // as explain does, against the Node object's.
  if (scenario.interfaceAddresses) tracker.setInterfaceAddresses(*scenario.interfaceAddresses);
  // NewFakeProxier's service CIDRs.
  tracker.upsertServiceCIDR(core::ServiceCIDR{"kubernetes", "1", kServiceCIDRs});

  const auto backend = explainingBackend(scenario, mode);
  for (std::size_t phase = 0; phase < scenario.phases.size(); ++phase) {
    scenario.phases[phase].apply(tracker);
    auto published = tracker.publish();
    REQUIRE(published.snapshot);

    for (const auto& c : scenario.phases[phase].cases) {
      if ((selection == Selection::kKnownDifferences) != (c.known != Known::kNone)) continue;
      plugins::ExplainRequest request;
      request.family = familyOf(c.destination);
      request.protocol = c.protocol == "udp"    ? core::Protocol::kUDP
                         : c.protocol == "sctp" ? core::Protocol::kSCTP
                                                : core::Protocol::kTCP;
      request.sourceIP = c.source;
      request.destinationIP = c.destination;
      request.destinationPort = static_cast<std::uint16_t>(c.port);
      request.fromNode = std::find(kNodeIPs.begin(), kNodeIPs.end(), c.source) != kNodeIPs.end();
      request.json = true;
      INFO(fmt::format("{}: phase {}, case \"{}\"{}: {} -> {}:{}/{}{}", mode, phase + 1, c.name,
                       c.known == Known::kNone ? "" : " (" + knownText(c.known) + ")", c.source, c.destination,
                       c.port, c.protocol, request.fromNode ? " (from the node)" : ""));
      auto text = backend->explain(*published.snapshot, request);
      ++checked;
      REQUIRE(text);
      nlohmann::json answer;
      REQUIRE_NOTHROW(answer = nlohmann::json::parse(*text));

      const std::string actual = outcomeText(answer);
      ++rowsChecked()[mode];
      ModeExpectation want{c.output, c.masq};
      for (const auto& other : c.outputIn)
        if (other.mode == mode) want = {other.output, other.masq, other.why};
      if (want.why == nullptr) want = modeRule(mode, scenario, c, request.fromNode, want);
      if (want.why != nullptr) {
        ++modeDifferences()[mode][want.why];
        INFO(fmt::format("{}'s known difference: {}", mode, want.why));
      }
      if (want.why == kUserspaceNoSCTP) {
        // Nothing is relayed, whatever upstream answers; the table refuses it at a ClusterIP of
        // other ports, as it refuses any.
        CHECK(splitOutput(actual).empty());
        continue;
      }
      const std::string expected = normalized(want.output);
      const bool masqueraded = answer.at("masqueraded").get<bool>();
      const bool expectMasq = want.masq;
      // On a mismatch, the answer as an operator reads it: endpoints in / out, rule by rule.
      std::string readable;
      if (actual != expected || masqueraded != expectMasq) {
        request.json = false;
        auto plain = backend->explain(*published.snapshot, request);
        readable = plain ? *plain : plain.error().message();
      }
      INFO(fmt::format("expected \"{}\" masq={}; got \"{}\" masq={}", expected, expectMasq, actual, masqueraded));
      INFO(readable);
      CHECK(answer.at("warnings").empty());
      CHECK_FALSE(answer.at("outcome").at("mixed").get<bool>());
      CHECK(actual == expected);
      CHECK(masqueraded == expectMasq);
      // Every drop and reject of the table says why, in every mode (the renderers' tags).
      if (actual == "DROP" || actual == "REJECT") {
        const std::string why = answer.at("reason").get<std::string>();
        CHECK(why.starts_with(actual == "DROP" ? "dropped: " : "rejected: "));
      }
      // The endpoints the answer lists as "in" are the DNAT set.
      std::vector<std::string> selected;
      for (const auto& e : answer.at("endpoints"))
        if (e.at("selected").get<bool>()) selected.push_back(e.at("endpoint").get<std::string>());
      std::sort(selected.begin(), selected.end());
      CHECK(selected == splitOutput(actual));
    }
  }
  return checked;
}

Phase phase(std::vector<core::Service> services, std::vector<core::EndpointSlice> slices, std::vector<FlowCase> cases) {
  return Phase{[services = std::move(services), slices = std::move(slices)](core::ChangeTracker& t) {
                 for (const auto& s : services) t.upsertService(s);
                 for (const auto& s : slices) t.upsertEndpointSlice(s);
               },
               std::move(cases)};
}

Phase deleteSlicesPhase(std::string ns, std::vector<std::string> sliceNames, std::vector<FlowCase> cases) {
  return Phase{[ns = std::move(ns), names = std::move(sliceNames)](core::ChangeTracker& t) {
                 for (const auto& n : names) t.deleteEndpointSlice(ns, n);
               },
               std::move(cases)};
}

}  // namespace

namespace {

/// One of upstream's tables run through one backend: the rows of one kind, all of them (a
/// case that checks no row, or fewer than the table has, fails).
class TableInvoker final : public Catch::ITestInvoker {
 public:
  TableInvoker(Scenario (*build)(), Selection selection, std::string mode, std::size_t rows)
      : build_(build), selection_(selection), mode_(std::move(mode)), rows_(rows) {}
  void invoke() const override {
    REQUIRE(rows_ > 0);
    CHECK(runScenario(build_(), selection_, mode_) == rows_);
  }

 private:
  Scenario (*build_)();
  Selection selection_;
  std::string mode_;
  std::size_t rows_;
};

/// A table whose scenario cannot be built: the case says why.
class BrokenTableInvoker final : public Catch::ITestInvoker {
 public:
  explicit BrokenTableInvoker(std::string why) : why_(std::move(why)) {}
  void invoke() const override { FAIL(why_); }

 private:
  std::string why_;
};

/// Registers the test cases of one of upstream's tables: per backend, one for the rows kproxy
/// and upstream always agreed on, and one for the rows whose answer kproxy came to share or
/// deliberately gives otherwise (Known), so a regression there names the behaviour. A kind
/// without rows in the table gets no test case.
int registerTable(const char* name, Scenario (*build)(), const char* file, std::size_t line) {
  // Catch keeps the names and tags by reference.
  static std::deque<std::string> texts;
  auto add = [&](Catch::ITestInvoker* invoker, std::string caseName, std::string tags) {
    texts.push_back(std::move(caseName));
    const std::string& n = texts.back();
    texts.push_back(std::move(tags));
    const std::string& t = texts.back();
    const Catch::AutoReg registered(invoker, Catch::SourceLineInfo(file, line), "", Catch::NameAndTags(n, t));
    (void)registered;
  };
  Scenario scenario;
  try {
    scenario = build();
  } catch (const std::exception& e) {
    add(new BrokenTableInvoker(std::string("building the table: ") + e.what()), name, "[unit][packet-flow]");
    return 0;
  }
  for (const std::string& mode : explainingModes()) {
    if (auto rows = rowsOf(scenario, Selection::kAgreed); rows > 0)
      add(new TableInvoker(build, Selection::kAgreed, mode, rows), fmt::format("{} [{}]", name, mode),
          fmt::format("[unit][packet-flow][{}]", mode));
    if (auto rows = rowsOf(scenario, Selection::kKnownDifferences); rows > 0)
      add(new TableInvoker(build, Selection::kKnownDifferences, mode, rows),
          fmt::format("{}, known differences [{}]", name, mode),
          fmt::format("[unit][packet-flow][known-difference][{}]", mode));
  }
  return 0;
}

}  // namespace

#define PACKET_FLOW_CONCAT2(a, b) a##b
#define PACKET_FLOW_CONCAT(a, b) PACKET_FLOW_CONCAT2(a, b)
#define PACKET_FLOW_TEST(NAME, BUILD)                                                           \
  namespace {                                                                                   \
  const int PACKET_FLOW_CONCAT(packetFlowTable, __COUNTER__) =                                  \
      registerTable(NAME, [] { return BUILD(); }, __FILE__, __LINE__);                           \
  }

// ---- TestOverallNFTablesRules / TestTracePacket ------------------------------------------

namespace {
Scenario overall() {
  using core::ServiceType;
  std::vector<core::Service> services{
      service("ns1", "svc1", "172.30.0.41", {port("p80", 80)}),
      service("ns2", "svc2", "172.30.0.42", {port("p80", 80, 3001)},
              [](core::Service& s) {
                loadBalancer(s, {"1.2.3.4"});
                s.externalTrafficPolicy = core::TrafficPolicy::kLocal;
                s.externalIPs = {"192.168.99.22"};
                s.healthCheckNodePort = 30000;
              }),
      service("ns3", "svc3", "172.30.0.43", {port("p80", 80, 3003)},
              [](core::Service& s) { s.type = ServiceType::kNodePort; }),
      service("ns4", "svc4", "172.30.0.44", {port("p80", 80)},
              [](core::Service& s) {
                s.type = ServiceType::kNodePort;
                s.externalIPs = {"192.168.99.33"};
              }),
      service("ns5", "svc5", "172.30.0.45", {port("p80", 80, 3002)},
              [](core::Service& s) {
                loadBalancer(s, {"5.6.7.8"});
                s.healthCheckNodePort = 30000;
                s.loadBalancerSourceRanges = {" 203.0.113.0/25"};
                s.sessionAffinity = core::SessionAffinity::kClientIP;
                s.sessionAffinityTimeoutSeconds = 10800;
              }),
      service("ns6", "svc6", "172.30.0.46", {port("p80", 80)}),
  };
  std::vector<core::EndpointSlice> slices{
      slice("ns1", "svc1", {slicePort("p80", 80)}, {sliceEndpoint("10.180.0.1")}),
      // No node name: not local, so svc2 (eTP=Local) has no local endpoint.
      slice("ns2", "svc2", {slicePort("p80", 80)}, {sliceEndpoint("10.180.0.2")}),
      slice("ns3", "svc3", {slicePort("p80", 80)}, {sliceEndpoint("10.180.0.3")}),
      slice("ns4", "svc4", {slicePort("p80", 80)},
            {sliceEndpoint("10.180.0.4"), sliceEndpoint("10.180.0.5", kNodeName)}),
      slice("ns5", "svc5", {slicePort("p80", 80)}, {sliceEndpoint("10.180.0.3")}),
  };
  std::vector<FlowCase> cases{
      {"no match", "10.0.0.2", "10.0.0.3", 80, ""},
      {"single endpoint", "10.0.0.2", "172.30.0.41", 80, "10.180.0.1:80"},
      {"multiple endpoints", "10.0.0.2", "172.30.0.44", 80, "10.180.0.4:80, 10.180.0.5:80"},
      {"local, mark for masquerade", kNodeIP, "192.168.99.22", 80, "10.180.0.2:80", true, "tcp",
       Known::kLocalShortCircuit},
      {"DROP", kExternalClient, "192.168.99.22", 80, "DROP"},
      {"REJECT", "10.0.0.2", "172.30.0.46", 80, "REJECT"},
      {"blocked external to loadbalancer IP", kExternalClientBlocked, "5.6.7.8", 80, "DROP"},
      {"pod to nodePort", "10.0.0.2", kNodeIP, 3001, "10.180.0.2:80", false, "tcp",
       Known::kLocalShortCircuit},
      // Not in upstream's table. Upstream's nftables code drops the node's own connections to
      // an eTP=Local LB IP / NodePort without a local endpoint (filter-output, before DNAT);
      // kproxy short-circuits them as iptables mode does (README, deliberate differences).
      {"node to LB IP, eTP=Local without local endpoints", kNodeIP, "1.2.3.4", 80, "10.180.0.2:80", true, "tcp",
       Known::kDeliberate},
      {"node to NodePort, eTP=Local without local endpoints", kNodeIP, kNodeIP, 3001, "10.180.0.2:80", true, "tcp",
       Known::kDeliberate},
  };
  Scenario s;
  s.phases.push_back(phase(services, slices, cases));
  return s;
}
}  // namespace
PACKET_FLOW_TEST("packet flow: TestOverallNFTablesRules (TestTracePacket)", overall)

// ---- TestNoEndpointsReject -----------------------------------------------------------------

namespace {
Scenario noEndpointsReject() {
  auto svc = service("ns1", "svc1", "172.30.0.41", {port("p80", 80, 3001)}, [](core::Service& s) {
    loadBalancer(s, {"1.2.3.4"});
    s.externalIPs = {"192.168.99.11"};
  });
  std::vector<FlowCase> cases{
      {"pod to cluster IP with no endpoints", "10.0.0.2", "172.30.0.41", 80, "REJECT"},
      {"external to external IP with no endpoints", kExternalClient, "192.168.99.11", 80, "REJECT"},
      {"pod to NodePort with no endpoints", "10.0.0.2", kNodeIP, 3001, "REJECT"},
      {"external to NodePort with no endpoints", kExternalClient, kNodeIP, 3001, "REJECT"},
      {"pod to LoadBalancer IP with no endpoints", "10.0.0.2", "1.2.3.4", 80, "REJECT"},
      {"external to LoadBalancer IP with no endpoints", kExternalClient, "1.2.3.4", 80, "REJECT"},
  };
  Scenario s;
  s.phases.push_back(phase({svc}, {}, cases));
  return s;
}
}  // namespace
PACKET_FLOW_TEST("packet flow: TestNoEndpointsReject", noEndpointsReject)

// ---- TestClusterIPGeneral ------------------------------------------------------------------

namespace {
Scenario clusterIPGeneral() {
  using core::Protocol;
  std::vector<core::Service> services{
      service("ns1", "svc1", "172.30.0.41", {port("http", 80)}),
      service("ns2", "svc2", "172.30.0.42",
              {port("http", 80), port("https", 443), port("dns-udp", 53, 0, Protocol::kUDP), port("dns-tcp", 53),
               port("dns-sctp", 53, 0, Protocol::kSCTP)}),
  };
  std::vector<core::EndpointSlice> slices{
      slice("ns1", "svc1", {slicePort("http", 80)}, {sliceEndpoint("10.180.0.1", kNodeName)}),
      slice("ns2", "svc2",
            {slicePort("http", 80), slicePort("https", 8443), slicePort("dns-udp", 53, Protocol::kUDP),
             slicePort("dns-tcp", 5353), slicePort("dns-sctp", 53, Protocol::kSCTP)},
            {sliceEndpoint("10.180.0.1", kNodeName), sliceEndpoint("10.180.2.1", "node2")}),
  };
  std::vector<FlowCase> cases{
      {"simple clusterIP", "10.180.0.2", "172.30.0.41", 80, "10.180.0.1:80", false},
      {"hairpin to cluster IP", "10.180.0.1", "172.30.0.41", 80, "10.180.0.1:80", true},
      {"clusterIP with multiple endpoints", "10.180.0.2", "172.30.0.42", 80, "10.180.0.1:80, 10.180.2.1:80"},
      {"clusterIP with TargetPort", "10.180.0.2", "172.30.0.42", 443, "10.180.0.1:8443, 10.180.2.1:8443"},
      {"clusterIP with TCP, UDP, and SCTP on same port (TCP)", "10.180.0.2", "172.30.0.42", 53,
       "10.180.0.1:5353, 10.180.2.1:5353", false, "tcp"},
      {"clusterIP with TCP, UDP, and SCTP on same port (UDP)", "10.180.0.2", "172.30.0.42", 53,
       "10.180.0.1:53, 10.180.2.1:53", false, "udp"},
      {"clusterIP with TCP, UDP, and SCTP on same port (SCTP)", "10.180.0.2", "172.30.0.42", 53,
       "10.180.0.1:53, 10.180.2.1:53", false, "sctp"},
      {"TCP-only port does not match UDP traffic", "10.180.0.2", "172.30.0.42", 80, "REJECT", false, "udp"},
      {"svc1 does not accept svc2's ports", "10.180.0.2", "172.30.0.41", 443, "REJECT"},
      {"packet to unallocated cluster ip", "10.180.0.2", "172.30.0.50", 80, "DROP", false, "tcp",
       Known::kUnallocatedClusterIPDropped},
  };
  Scenario s;
  s.phases.push_back(phase(services, slices, cases));
  return s;
}
}  // namespace
PACKET_FLOW_TEST("packet flow: TestClusterIPGeneral", clusterIPGeneral)

// ---- TestLoadBalancer ----------------------------------------------------------------------

namespace {
Scenario loadBalancerScenario() {
  auto svc = service("ns1", "svc1", "172.30.0.41", {port("p80", 80, 3001)}, [](core::Service& s) {
    loadBalancer(s, {"1.2.3.4", "5.6.7.8"});
    // Whitespace as upstream: it must be ignored.
    s.loadBalancerSourceRanges = {"192.168.0.0/24", " 203.0.113.0/25"};
  });
  auto eps = slice("ns1", "svc1", {slicePort("p80", 80)}, {sliceEndpoint("10.180.0.1")});
  const std::string ep = "10.180.0.1:80";
  constexpr bool kUnsteeredInEbpf = true;
  std::vector<FlowCase> cases{
      {"pod to cluster IP", "10.0.0.2", "172.30.0.41", 80, ep, false},
      {"external to nodePort", kExternalClient, kNodeIP, 3001, ep, true},
      {"nodePort bypasses LoadBalancerSourceRanges", kExternalClientBlocked, kNodeIP, 3001, ep, true},
      {"accepted external to LB1", kExternalClient, "1.2.3.4", 80, ep, true},
      {"accepted external to LB2", kExternalClient, "5.6.7.8", 80, ep, true},
      {"blocked external to LB1", kExternalClientBlocked, "1.2.3.4", 80, "DROP"},
      {"blocked external to LB2", kExternalClientBlocked, "5.6.7.8", 80, "DROP"},
      {"pod to LB1 (blocked by LoadBalancerSourceRanges)", "10.0.0.2", "1.2.3.4", 80, "DROP", false, "tcp",
       Known::kNone, {}, kUnsteeredInEbpf},
      {"pod to LB2 (blocked by LoadBalancerSourceRanges)", "10.0.0.2", "5.6.7.8", 80, "DROP", false, "tcp",
       Known::kNone, {}, kUnsteeredInEbpf},
      {"node to LB1 (allowed by LoadBalancerSourceRanges)", kNodeIP, "1.2.3.4", 80, ep, true, "tcp", Known::kNone,
       {}, kUnsteeredInEbpf},
      {"node to LB2 (allowed by LoadBalancerSourceRanges)", kNodeIP, "5.6.7.8", 80, ep, true, "tcp", Known::kNone,
       {}, kUnsteeredInEbpf},
      {"same node to LB1, SNATted to LB1 (implicitly allowed)", "1.2.3.4", "1.2.3.4", 80, ep, true, "tcp",
       Known::kSourceRangesAdmitNode},
      {"same node to LB2, SNATted to LB2 (implicitly allowed)", "5.6.7.8", "5.6.7.8", 80, ep, true, "tcp",
       Known::kSourceRangesAdmitNode},
  };
  Scenario s;
  s.phases.push_back(phase({svc}, {eps}, cases));
  return s;
}
}  // namespace
PACKET_FLOW_TEST("packet flow: TestLoadBalancer", loadBalancerScenario)

// ---- TestNodePorts -------------------------------------------------------------------------

namespace {
Scenario nodePorts(net::Family family, std::vector<std::string> nodePortAddresses, bool allowAltNodeIP) {
  const bool v4 = family == net::Family::kIPv4;
  const std::string svcIP = v4 ? "172.30.0.41" : "fd00:172:30::41";
  const std::string ep1 = v4 ? "10.180.0.1" : "fd00:10:180::1";
  const std::string ep2 = v4 ? "10.180.2.1" : "fd00:10:180::2:1";
  const std::string nodeIP = v4 ? kNodeIP : kNodeIPv6;
  const std::string podIP = v4 ? "10.0.0.2" : "fd00:10::2";
  const std::string external = v4 ? kExternalClient : "2600:5200::1";
  const std::string alt = v4 ? kNodeIPAlt : kNodeIPv6Alt;
  const std::string output = v4 ? "10.180.0.1:80, 10.180.2.1:80" : "[fd00:10:180::1]:80, [fd00:10:180::2:1]:80";

  auto svc = service("ns1", "svc1", svcIP, {port("p80", 80, 3001)},
                     [](core::Service& s) { s.type = core::ServiceType::kNodePort; });
  auto eps = slice("ns1", "svc1", {slicePort("p80", 80)}, {sliceEndpoint(ep1), sliceEndpoint(ep2, kNodeName)});
  std::vector<FlowCase> cases{
      {"pod to cluster IP", podIP, svcIP, 80, output, false},
      {"external to nodePort", external, nodeIP, 3001, output, true},
      {"node to nodePort", nodeIP, nodeIP, 3001, output, true},
  };
  if (allowAltNodeIP) {
    cases.push_back({"external to nodePort on secondary IP", external, alt, 3001, output, true});
  } else {
    cases.push_back({"secondary nodeIP ignores NodePorts", external, alt, 3001, ""});
  }
  Scenario s;
  s.clusterCIDRs = {v4 ? "10.0.0.0/8" : "fd00:10::/64"};
  if (!nodePortAddresses.empty()) s.nodePortAddresses = std::move(nodePortAddresses);
  s.phases.push_back(phase({svc}, {eps}, cases));
  return s;
}
Scenario nodePortsV4() { return nodePorts(net::Family::kIPv4, {}, false); }
Scenario nodePortsV4Multiple() {
  return nodePorts(net::Family::kIPv4, {"192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64"}, true);
}
Scenario nodePortsV6() { return nodePorts(net::Family::kIPv6, {}, false); }
Scenario nodePortsV6Multiple() {
  return nodePorts(net::Family::kIPv6, {"192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64", "2001:db8:1::2/128"}, true);
}
}  // namespace
PACKET_FLOW_TEST("packet flow: TestNodePorts ipv4", nodePortsV4)
PACKET_FLOW_TEST("packet flow: TestNodePorts ipv4, multiple nodeport-addresses", nodePortsV4Multiple)
PACKET_FLOW_TEST("packet flow: TestNodePorts ipv6", nodePortsV6)
PACKET_FLOW_TEST("packet flow: TestNodePorts ipv6, multiple nodeport-addresses", nodePortsV6Multiple)

// ---- kproxy's own: where NodePorts answer, by --nodeport-addresses -------------------------
//
// Not an upstream table: upstream's tables always give nodeport-addresses, so these rows hold
// every mode to one decision (core::decideNodePortAddresses) for the inputs upstream's own
// server.go and NodePortAddresses give meaning to: no flag (nftables' default is "primary",
// the other modes' every local address), "primary", "primary" with a --bind-address, a CIDR
// that selects the node's secondary address, a CIDR that selects an address only an interface
// holds, and 0.0.0.0/0. Each runs as the daemon decides (interface addresses read) and as
// `kproxy explain` does (the Node object's addresses): both answer alike, but that explain
// does not know an address the Node object does not list.

namespace {
constexpr const char* kInterfaceOnlyIP = "172.16.5.5";  // an interface's, not in the Node object

/// Which of the three node addresses NodePorts answer on, per variant.
struct NodePortAnswers {
  bool primary = false;        // 192.168.0.2, the node IP
  bool secondary = false;      // 192.168.1.2, another InternalIP
  bool interfaceOnly = false;  // 172.16.5.5, on an interface only (the daemon's view)
  std::vector<std::string> otherwiseIn = {};  // modes that answer the opposite on secondary and interface-only
};

Scenario nodePortAddressesScenario(std::vector<std::string> spec, bool unset, std::string bindAddress, bool daemon,
                                   NodePortAnswers answers) {
  auto svc = service("ns1", "svc1", "172.30.0.41", {port("p80", 80, 3001)},
                     [](core::Service& s) { s.type = core::ServiceType::kNodePort; });
  auto eps = slice("ns1", "svc1", {slicePort("p80", 80)},
                   {sliceEndpoint("10.180.0.1"), sliceEndpoint("10.180.2.1", kNodeName)});
  const std::string both = "10.180.0.1:80, 10.180.2.1:80";
  auto row = [&](std::string name, const char* destination, bool answered, bool modeDependent) {
    FlowCase c{std::move(name), kExternalClient, destination, 3001, answered ? both : "", answered};
    if (modeDependent)
      for (const auto& mode : answers.otherwiseIn)
        c.outputIn.push_back(FlowCase::ModeAnswer{mode, answered ? "" : both, !answered});
    return c;
  };
  std::vector<FlowCase> cases{
      row("external to NodePort on the node IP", kNodeIP, answers.primary, false),
      row("external to NodePort on the secondary node address", kNodeIPAlt, answers.secondary, true),
      // Explain knows the Node object's addresses only: an interface's own is not the node's.
      row("external to NodePort on an interface-only address", kInterfaceOnlyIP, daemon && answers.interfaceOnly,
          daemon),
      {"pod to cluster IP", "10.0.0.2", "172.30.0.41", 80, both, false},
  };
  Scenario s;
  s.nodePortAddresses = std::move(spec);
  s.nodePortAddressesUnset = unset;
  s.bindAddress = std::move(bindAddress);
  if (daemon)
    s.interfaceAddresses = Scenario::interfacesWith({kInterfaceOnlyIP});
  else
    s.interfaceAddresses.reset();
  s.phases.push_back(phase({svc}, {eps}, cases));
  return s;
}

// No flag: nftables answers on the node IP only ("primary"), every other mode on every local
// address.
const NodePortAnswers kUnsetAnswers{true, true, true, {"nftables"}};
Scenario nodePortsUnsetDaemon() { return nodePortAddressesScenario({}, true, "", true, kUnsetAnswers); }
Scenario nodePortsUnsetExplain() { return nodePortAddressesScenario({}, true, "", false, kUnsetAnswers); }
Scenario nodePortsPrimaryDaemon() { return nodePortAddressesScenario({"primary"}, false, "", true, {true, false, false}); }
Scenario nodePortsPrimaryExplain() { return nodePortAddressesScenario({"primary"}, false, "", false, {true, false, false}); }
// --bind-address replaces the node IP of its family (upstream's detectNodeIPs).
Scenario nodePortsPrimaryBindDaemon() {
  return nodePortAddressesScenario({"primary"}, false, kNodeIPAlt, true, {false, true, false});
}
Scenario nodePortsPrimaryBindExplain() {
  return nodePortAddressesScenario({"primary"}, false, kNodeIPAlt, false, {false, true, false});
}
Scenario nodePortsSecondaryCIDRDaemon() {
  return nodePortAddressesScenario({"192.168.1.0/24"}, false, "", true, {false, true, false});
}
Scenario nodePortsSecondaryCIDRExplain() {
  return nodePortAddressesScenario({"192.168.1.0/24"}, false, "", false, {false, true, false});
}
Scenario nodePortsInterfaceCIDRDaemon() {
  return nodePortAddressesScenario({"172.16.0.0/16"}, false, "", true, {false, false, true});
}
Scenario nodePortsInterfaceCIDRExplain() {
  return nodePortAddressesScenario({"172.16.0.0/16"}, false, "", false, {false, false, true});
}
Scenario nodePortsAllDaemon() { return nodePortAddressesScenario({"0.0.0.0/0"}, false, "", true, {true, true, true}); }
Scenario nodePortsAllExplain() { return nodePortAddressesScenario({"0.0.0.0/0"}, false, "", false, {true, true, true}); }
}  // namespace
PACKET_FLOW_TEST("packet flow: NodePort addresses, no flag (each mode's default), daemon", nodePortsUnsetDaemon)
PACKET_FLOW_TEST("packet flow: NodePort addresses, no flag (each mode's default), explain", nodePortsUnsetExplain)
PACKET_FLOW_TEST("packet flow: NodePort addresses, primary, daemon", nodePortsPrimaryDaemon)
PACKET_FLOW_TEST("packet flow: NodePort addresses, primary, explain", nodePortsPrimaryExplain)
PACKET_FLOW_TEST("packet flow: NodePort addresses, primary with --bind-address, daemon", nodePortsPrimaryBindDaemon)
PACKET_FLOW_TEST("packet flow: NodePort addresses, primary with --bind-address, explain", nodePortsPrimaryBindExplain)
PACKET_FLOW_TEST("packet flow: NodePort addresses, a CIDR of the secondary address, daemon", nodePortsSecondaryCIDRDaemon)
PACKET_FLOW_TEST("packet flow: NodePort addresses, a CIDR of the secondary address, explain", nodePortsSecondaryCIDRExplain)
PACKET_FLOW_TEST("packet flow: NodePort addresses, a CIDR of an interface-only address, daemon", nodePortsInterfaceCIDRDaemon)
PACKET_FLOW_TEST("packet flow: NodePort addresses, a CIDR of an interface-only address, explain",
                 nodePortsInterfaceCIDRExplain)
PACKET_FLOW_TEST("packet flow: NodePort addresses, 0.0.0.0/0, daemon", nodePortsAllDaemon)
PACKET_FLOW_TEST("packet flow: NodePort addresses, 0.0.0.0/0, explain", nodePortsAllExplain)

// ---- TestExternalTrafficPolicyLocal / Cluster ----------------------------------------------

namespace {
Scenario externalTrafficPolicy(bool local) {
  auto svc = service("ns1", "svc1", "172.30.0.41", {port("p80", 80, 3001)}, [local](core::Service& s) {
    loadBalancer(s, {"1.2.3.4"});
    s.externalIPs = {"192.168.99.11"};
    if (local) {
      s.externalTrafficPolicy = core::TrafficPolicy::kLocal;
      s.healthCheckNodePort = 30000;
    }
  });
  auto eps = slice("ns1", "svc1", {slicePort("p80", 80)},
                   {sliceEndpoint("10.180.0.1"), sliceEndpoint("10.180.2.1", kNodeName)});
  const std::string both = "10.180.0.1:80, 10.180.2.1:80";
  const std::string onlyLocal = "10.180.2.1:80";
  std::vector<FlowCase> cases;
  if (local) {
    cases = {
        {"pod to cluster IP hits both endpoints, unmasqueraded", "10.0.0.2", "172.30.0.41", 80, both, false},
        {"pod to external IP hits both endpoints, unmasqueraded", "10.0.0.2", "192.168.99.11", 80, both, false},
        {"external to external IP hits only local endpoint, unmasqueraded", kExternalClient, "192.168.99.11", 80,
         onlyLocal, false},
        {"pod to LB IP hits only both endpoints, unmasqueraded", "10.0.0.2", "1.2.3.4", 80, both, false},
        {"external to LB IP hits only local endpoint, unmasqueraded", kExternalClient, "1.2.3.4", 80, onlyLocal,
         false},
        {"pod to NodePort hits both endpoints, unmasqueraded", "10.0.0.2", kNodeIP, 3001, both, false},
        {"external to NodePort hits only local endpoint, unmasqueraded", kExternalClient, kNodeIP, 3001, onlyLocal,
         false},
    };
  } else {
    cases = {
        {"pod to cluster IP hits both endpoints, unmasqueraded", "10.0.0.2", "172.30.0.41", 80, both, false},
        {"pod to external IP hits both endpoints, masqueraded", "10.0.0.2", "192.168.99.11", 80, both, true},
        {"external to external IP hits both endpoints, masqueraded", kExternalClient, "192.168.99.11", 80, both,
         true},
        {"pod to LB IP hits both endpoints, masqueraded", "10.0.0.2", "1.2.3.4", 80, both, true},
        {"external to LB IP hits both endpoints, masqueraded", kExternalClient, "1.2.3.4", 80, both, true},
        {"pod to NodePort hits both endpoints, masqueraded", "10.0.0.2", kNodeIP, 3001, both, true},
        {"external to NodePort hits both endpoints, masqueraded", kExternalClient, kNodeIP, 3001, both, true},
    };
  }
  Scenario s;
  s.phases.push_back(phase({svc}, {eps}, cases));
  return s;
}
Scenario externalTrafficPolicyLocal() { return externalTrafficPolicy(true); }
Scenario externalTrafficPolicyCluster() { return externalTrafficPolicy(false); }
}  // namespace
PACKET_FLOW_TEST("packet flow: TestExternalTrafficPolicyLocal", externalTrafficPolicyLocal)
PACKET_FLOW_TEST("packet flow: TestExternalTrafficPolicyCluster", externalTrafficPolicyCluster)

// ---- TestInternalTrafficPolicy -------------------------------------------------------------

namespace {
Scenario internalTrafficPolicy(bool local, std::vector<std::pair<std::string, std::string>> endpoints,
                               FlowCase flow) {
  auto svc = service("ns1", "svc1", "172.30.1.1", {port("", 80)}, [local](core::Service& s) {
    s.internalTrafficPolicy = local ? core::TrafficPolicy::kLocal : core::TrafficPolicy::kCluster;
  });
  std::vector<core::SliceEndpoint> list;
  for (auto& [ip, node] : endpoints) list.push_back(sliceEndpoint(ip, node, Conditions{true, {}, {}}));
  auto eps = slice("ns1", "svc1", {slicePort("", 80)}, std::move(list));
  Scenario s;
  s.phases.push_back(phase({svc}, {eps}, {std::move(flow)}));
  s.phases.push_back(deleteSlicesPhase("ns1", {"svc1-1"},
                                       {{"endpoints deleted", "10.0.0.2", "172.30.1.1", 80, "REJECT"}}));
  return s;
}
Scenario itpCluster() {
  return internalTrafficPolicy(false, {{"10.0.1.1", kNodeName}, {"10.0.1.2", "node1"}, {"10.0.1.3", "node2"}},
                               {"pod to ClusterIP hits all endpoints", "10.0.0.2", "172.30.1.1", 80,
                                "10.0.1.1:80, 10.0.1.2:80, 10.0.1.3:80"});
}
Scenario itpLocalOne() {
  return internalTrafficPolicy(true, {{"10.0.1.1", kNodeName}, {"10.0.1.2", "node1"}, {"10.0.1.3", "node2"}},
                               {"pod to ClusterIP hits only local endpoint", "10.0.0.2", "172.30.1.1", 80,
                                "10.0.1.1:80"});
}
Scenario itpLocalMultiple() {
  return internalTrafficPolicy(true, {{"10.0.1.1", kNodeName}, {"10.0.1.2", kNodeName}, {"10.0.1.3", "node2"}},
                               {"pod to ClusterIP hits all local endpoints", "10.0.0.2", "172.30.1.1", 80,
                                "10.0.1.1:80, 10.0.1.2:80"});
}
Scenario itpLocalNone() {
  return internalTrafficPolicy(true, {{"10.0.1.1", "node0"}, {"10.0.1.2", "node1"}, {"10.0.1.3", "node2"}},
                               {"no endpoints", "10.0.0.2", "172.30.1.1", 80, "DROP", false, "tcp", Known::kNone,
                                {{"ebpf", "REJECT", false, kEbpfRefusedNotDropped}}});
}
}  // namespace
PACKET_FLOW_TEST("packet flow: TestInternalTrafficPolicy cluster", itpCluster)
PACKET_FLOW_TEST("packet flow: TestInternalTrafficPolicy local, one local endpoint", itpLocalOne)
PACKET_FLOW_TEST("packet flow: TestInternalTrafficPolicy local, multiple local endpoints", itpLocalMultiple)
PACKET_FLOW_TEST("packet flow: TestInternalTrafficPolicy local, no local endpoints", itpLocalNone)

// ---- TestTerminatingEndpointsTrafficPolicyLocal / Cluster ----------------------------------

namespace {
// `affinity`: pkg/proxy/iptables/proxier_test.go runs the Local tables with ClientIP affinity.
Scenario terminating(bool local, std::vector<core::SliceEndpoint> endpoints, std::vector<FlowCase> cases,
                     bool affinity = false) {
  auto svc = service("ns1", "svc1", "172.30.1.1", {port("", 80)}, [local, affinity](core::Service& s) {
    loadBalancer(s, {"1.2.3.4"});
    if (affinity) {
      s.sessionAffinity = core::SessionAffinity::kClientIP;
      s.sessionAffinityTimeoutSeconds = core::kDefaultStickyMaxAgeSeconds;
    }
    s.externalTrafficPolicy = local ? core::TrafficPolicy::kLocal : core::TrafficPolicy::kCluster;
    s.healthCheckNodePort = 30000;
  });
  auto eps = slice("ns1", "svc1", {slicePort("", 80)}, std::move(endpoints));
  Scenario s;
  s.phases.push_back(phase({svc}, {eps}, std::move(cases)));
  s.phases.push_back(
      deleteSlicesPhase("ns1", {"svc1-1"},
                        {{"pod to clusterIP after endpoints deleted", "10.0.0.2", "172.30.1.1", 80, "REJECT"},
                         {"external to LB after endpoints deleted", kExternalClient, "1.2.3.4", 80, "REJECT"}}));
  return s;
}

Scenario terminatingLocalReady(bool affinity = false) {
  return terminating(true,
                     {sliceEndpoint("10.0.1.1", kNodeName, kReady), sliceEndpoint("10.0.1.2", kNodeName, kReady),
                      sliceEndpoint("10.0.1.3", kNodeName, kServingTerminating),
                      sliceEndpoint("10.0.1.4", kNodeName, kTerminating), sliceEndpoint("10.0.1.5", "node-1", kReady)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, "10.0.1.1:80, 10.0.1.2:80, 10.0.1.5:80"},
                      {"external to LB", kExternalClient, "1.2.3.4", 80, "10.0.1.1:80, 10.0.1.2:80"}},
                     affinity);
}
Scenario terminatingLocalOnlyTerminating(bool affinity = false) {
  return terminating(true,
                     {sliceEndpoint("10.0.1.2", kNodeName, kServingTerminating),
                      sliceEndpoint("10.0.1.3", kNodeName, kServingTerminating),
                      sliceEndpoint("10.0.1.4", kNodeName, kTerminating), sliceEndpoint("10.0.1.5", "node-1", kReady)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, "10.0.1.5:80"},
                      {"external to LB", kExternalClient, "1.2.3.4", 80, "10.0.1.2:80, 10.0.1.3:80"}},
                     affinity);
}
Scenario terminatingLocalRemote(bool affinity = false) {
  return terminating(true, {sliceEndpoint("10.0.1.5", "node-1", kServingTerminating)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, "10.0.1.5:80"},
                      {"external to LB, no locally-usable endpoints", kExternalClient, "1.2.3.4", 80, "DROP"}},
                     affinity);
}
Scenario terminatingLocalNoneUsable(bool affinity = false) {
  return terminating(true,
                     {sliceEndpoint("10.0.1.5", kNodeName, kTerminating), sliceEndpoint("10.0.1.5", "node-1", kTerminating)},
                     {{"pod to clusterIP, no usable endpoints", "10.0.0.2", "172.30.1.1", 80, "REJECT"},
                      {"external to LB, no usable endpoints", kExternalClient, "1.2.3.4", 80, "REJECT"}},
                     affinity);
}

Scenario terminatingClusterReady() {
  const std::string all = "10.0.1.1:80, 10.0.1.2:80, 10.0.1.5:80";
  return terminating(false,
                     {sliceEndpoint("10.0.1.1", kNodeName, kReady), sliceEndpoint("10.0.1.2", kNodeName, kReady),
                      sliceEndpoint("10.0.1.3", "another-node", kServingTerminating),
                      sliceEndpoint("10.0.1.4", "another-node", kTerminating),
                      sliceEndpoint("10.0.1.5", "another-node", kReady)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, all, false},
                      {"external to LB", kExternalClient, "1.2.3.4", 80, all, true}});
}
Scenario terminatingClusterOnlyTerminating() {
  const std::string all = "10.0.1.2:80, 10.0.1.3:80, 10.0.1.5:80";
  return terminating(false,
                     {sliceEndpoint("10.0.1.2", kNodeName, kServingTerminating),
                      sliceEndpoint("10.0.1.3", kNodeName, kServingTerminating),
                      sliceEndpoint("10.0.1.4", "another-node", kTerminating),
                      sliceEndpoint("10.0.1.5", "another-node", kServingTerminating)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, all, false},
                      {"external to LB", kExternalClient, "1.2.3.4", 80, all, true}});
}
Scenario terminatingClusterRemote() {
  return terminating(false, {sliceEndpoint("10.0.1.5", "node-1", kServingTerminating)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, "10.0.1.5:80", false},
                      {"external to LB", kExternalClient, "1.2.3.4", 80, "10.0.1.5:80", true}});
}
Scenario terminatingClusterNoneUsable() {
  return terminating(false,
                     {sliceEndpoint("10.0.1.5", kNodeName, kTerminating), sliceEndpoint("10.0.1.5", "node-1", kTerminating)},
                     {{"pod to clusterIP", "10.0.0.2", "172.30.1.1", 80, "REJECT"},
                      {"external to LB", kExternalClient, "1.2.3.4", 80, "REJECT"}});
}
Scenario terminatingLocalReadyAffinity() { return terminatingLocalReady(true); }
Scenario terminatingLocalOnlyTerminatingAffinity() { return terminatingLocalOnlyTerminating(true); }
Scenario terminatingLocalRemoteAffinity() { return terminatingLocalRemote(true); }
Scenario terminatingLocalNoneUsableAffinity() { return terminatingLocalNoneUsable(true); }
}  // namespace
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyLocal ready endpoints exist", terminatingLocalReady)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyLocal only terminating endpoints exist",
                 terminatingLocalOnlyTerminating)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyLocal terminating endpoints on remote node",
                 terminatingLocalRemote)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyLocal no usable endpoints on any node",
                 terminatingLocalNoneUsable)
PACKET_FLOW_TEST("packet flow: iptables TestTerminatingEndpointsTrafficPolicyLocal (affinity) ready endpoints exist",
                 terminatingLocalReadyAffinity)
PACKET_FLOW_TEST("packet flow: iptables TestTerminatingEndpointsTrafficPolicyLocal (affinity) only terminating",
                 terminatingLocalOnlyTerminatingAffinity)
PACKET_FLOW_TEST("packet flow: iptables TestTerminatingEndpointsTrafficPolicyLocal (affinity) remote terminating",
                 terminatingLocalRemoteAffinity)
PACKET_FLOW_TEST("packet flow: iptables TestTerminatingEndpointsTrafficPolicyLocal (affinity) none usable",
                 terminatingLocalNoneUsableAffinity)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyCluster ready endpoints exist",
                 terminatingClusterReady)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyCluster only terminating endpoints exist",
                 terminatingClusterOnlyTerminating)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyCluster terminating endpoints on remote node",
                 terminatingClusterRemote)
PACKET_FLOW_TEST("packet flow: TestTerminatingEndpointsTrafficPolicyCluster no usable endpoints on any node",
                 terminatingClusterNoneUsable)

// ---- pkg/proxy/iptables (v1.28.0): TestOnlyLocalNodePorts / TestOnlyLocalNodePortsNoClusterCIDR

namespace {
Scenario onlyLocalNodePorts(bool localDetector) {
  auto svc = service("ns1", "svc1", "172.30.0.41", {port("p80", 80, 3001)}, [](core::Service& s) {
    s.type = core::ServiceType::kNodePort;
    s.externalTrafficPolicy = core::TrafficPolicy::kLocal;
  });
  auto eps = slice("ns1", "svc1", {slicePort("p80", 80)},
                   {sliceEndpoint("10.180.0.1"), sliceEndpoint("10.180.2.1", kNodeName)});
  std::vector<FlowCase> cases{
      {"pod to cluster IP hit both endpoints", "10.0.0.2", "172.30.0.41", 80, "10.180.0.1:80, 10.180.2.1:80", false},
      {"external to NodePort hits only local endpoint", kExternalClient, kNodeIP, 3001, "10.180.2.1:80", false},
      {"pod to localhost doesn't work because localhost is not in nodePortAddresses", "10.0.0.2", "127.0.0.1",
       3001, ""},
  };
  if (localDetector) {
    cases.push_back({"pod to NodePort hits both endpoints", "10.0.0.2", kNodeIP, 3001, "10.180.0.1:80, 10.180.2.1:80",
                     false});
  } else {
    cases.push_back({"pod to NodePort hits only local endpoint", "10.0.0.2", kNodeIP, 3001, "10.180.2.1:80", false});
  }
  Scenario s;
  if (!localDetector) s.clusterCIDRs.clear();
  s.nodePortAddresses = {"192.168.0.0/24"};
  s.phases.push_back(phase({svc}, {eps}, cases));
  return s;
}
Scenario onlyLocalNodePortsDetector() { return onlyLocalNodePorts(true); }
Scenario onlyLocalNodePortsNoClusterCIDR() { return onlyLocalNodePorts(false); }
}  // namespace
PACKET_FLOW_TEST("packet flow: iptables TestOnlyLocalNodePorts", onlyLocalNodePortsDetector)
PACKET_FLOW_TEST("packet flow: iptables TestOnlyLocalNodePortsNoClusterCIDR", onlyLocalNodePortsNoClusterCIDR)

// ---- TestInternalExternalMasquerade --------------------------------------------------------

namespace {
Scenario internalExternalMasquerade(bool masqueradeAll, bool localDetector) {
  std::vector<core::Service> services{
      service("ns1", "svc1", "172.30.0.41", {port("p80", 80, 3001)},
              [](core::Service& s) {
                loadBalancer(s, {"1.2.3.4"});
                s.healthCheckNodePort = 30001;
              }),
      service("ns2", "svc2", "172.30.0.42", {port("p80", 80, 3002)},
              [](core::Service& s) {
                loadBalancer(s, {"5.6.7.8"});
                s.healthCheckNodePort = 30002;
                s.externalTrafficPolicy = core::TrafficPolicy::kLocal;
              }),
      service("ns3", "svc3", "172.30.0.43", {port("p80", 80, 3003)},
              [](core::Service& s) {
                loadBalancer(s, {"9.10.11.12"});
                s.healthCheckNodePort = 30003;
                s.internalTrafficPolicy = core::TrafficPolicy::kLocal;
              }),
  };
  std::vector<core::EndpointSlice> slices;
  for (int i = 1; i <= 3; ++i)
    slices.push_back(slice(fmt::format("ns{}", i), fmt::format("svc{}", i), {slicePort("p80", 80)},
                           {sliceEndpoint(fmt::format("10.180.0.{}", i), kNodeName),
                            sliceEndpoint(fmt::format("10.180.1.{}", i), "remote")}));
  const std::string s1 = "10.180.0.1:80, 10.180.1.1:80";
  const std::string s2 = "10.180.0.2:80, 10.180.1.2:80";
  const std::string s3 = "10.180.0.3:80, 10.180.1.3:80";
  // The normal case (local detector, no masquerade-all), then the variants' overrides.
  std::vector<FlowCase> cases{
      {"pod to ClusterIP", "10.0.0.2", "172.30.0.41", 80, s1, false},
      {"pod to NodePort", "10.0.0.2", kNodeIP, 3001, s1, true},
      {"pod to LB", "10.0.0.2", "1.2.3.4", 80, s1, true},
      {"node to ClusterIP", kNodeIP, "172.30.0.41", 80, s1, true},
      {"node to NodePort", kNodeIP, kNodeIP, 3001, s1, true},
      {"node to LB", kNodeIP, "1.2.3.4", 80, s1, true},
      {"external to ClusterIP", kExternalClient, "172.30.0.41", 80, s1, true},
      {"external to NodePort", kExternalClient, kNodeIP, 3001, s1, true},
      {"external to LB", kExternalClient, "1.2.3.4", 80, s1, true},
      {"pod to ClusterIP with eTP:Local", "10.0.0.2", "172.30.0.42", 80, s2, false},
      {"pod to NodePort with eTP:Local", "10.0.0.2", kNodeIP, 3002, s2, false},
      {"pod to LB with eTP:Local", "10.0.0.2", "5.6.7.8", 80, s2, false},
      {"node to ClusterIP with eTP:Local", kNodeIP, "172.30.0.42", 80, s2, true},
      // Upstream's case sends this one to svc1's NodePort.
      {"node to NodePort with eTP:Local", kNodeIP, kNodeIP, 3001, s1, true},
      {"node to LB with eTP:Local", kNodeIP, "5.6.7.8", 80, s2, true},
      {"external to ClusterIP with eTP:Local", kExternalClient, "172.30.0.42", 80, s2, true},
      {"external to NodePort with eTP:Local", kExternalClient, kNodeIP, 3002, "10.180.0.2:80", false},
      {"external to LB with eTP:Local", kExternalClient, "5.6.7.8", 80, "10.180.0.2:80", false},
      {"pod to ClusterIP with iTP:Local", "10.0.0.2", "172.30.0.43", 80, "10.180.0.3:80", false},
      {"pod to NodePort with iTP:Local", "10.0.0.2", kNodeIP, 3003, s3, true},
      {"pod to LB with iTP:Local", "10.0.0.2", "9.10.11.12", 80, s3, true},
      {"node to ClusterIP with iTP:Local", kNodeIP, "172.30.0.43", 80, "10.180.0.3:80", true},
      {"node to NodePort with iTP:Local", kNodeIP, kNodeIP, 3003, s3, true},
      {"node to LB with iTP:Local", kNodeIP, "9.10.11.12", 80, s3, true},
      {"external to ClusterIP with iTP:Local", kExternalClient, "172.30.0.43", 80, "10.180.0.3:80", true},
      {"external to NodePort with iTP:Local", kExternalClient, kNodeIP, 3003, s3, true},
      {"external to LB with iTP:Local", kExternalClient, "9.10.11.12", 80, s3, true},
  };
  auto override = [&](const std::string& name, std::optional<std::string> output, std::optional<bool> masq,
                       Known known = Known::kNone) {
    auto it = std::find_if(cases.begin(), cases.end(), [&](const FlowCase& c) { return c.name == name; });
    if (it == cases.end()) throw std::logic_error("no row named \"" + name + "\"");
    if (output) it->output = *output;
    if (masq) it->masq = *masq;
    it->known = known;
  };
  if (!localDetector) {
    // No cluster CIDR: all ClusterIP traffic is taken for pod traffic (no masquerade), and
    // pods get no eTP=Local short-circuit.
    for (const char* name : {"node to ClusterIP", "node to ClusterIP with eTP:Local", "node to ClusterIP with iTP:Local",
                             "external to ClusterIP", "external to ClusterIP with eTP:Local",
                             "external to ClusterIP with iTP:Local"})
      override(name, std::nullopt, masqueradeAll);
    override("pod to NodePort with eTP:Local", "10.180.0.2:80", std::nullopt);
    override("pod to LB with eTP:Local", "10.180.0.2:80", std::nullopt);
  }
  if (masqueradeAll) {
    for (const char* name : {"pod to ClusterIP", "pod to ClusterIP with eTP:Local", "pod to ClusterIP with iTP:Local"})
      override(name, std::nullopt, true);
    if (localDetector) {
      // The short-circuit reaches the service chain, whose masquerade-all rule must not apply.
      override("pod to NodePort with eTP:Local", std::nullopt, std::nullopt, Known::kShortCircuitNotMasqueraded);
      override("pod to LB with eTP:Local", std::nullopt, std::nullopt, Known::kShortCircuitNotMasqueraded);
    }
  }
  Scenario s;
  if (!localDetector) s.clusterCIDRs.clear();
  s.masqueradeAll = masqueradeAll;
  s.phases.push_back(phase(services, slices, cases));
  return s;
}
Scenario masqueradeBase() { return internalExternalMasquerade(false, true); }
Scenario masqueradeNoDetector() { return internalExternalMasquerade(false, false); }
Scenario masqueradeAll() { return internalExternalMasquerade(true, true); }
Scenario masqueradeAllNoDetector() { return internalExternalMasquerade(true, false); }
}  // namespace
PACKET_FLOW_TEST("packet flow: TestInternalExternalMasquerade base", masqueradeBase)
PACKET_FLOW_TEST("packet flow: TestInternalExternalMasquerade no LocalTrafficDetector", masqueradeNoDetector)
PACKET_FLOW_TEST("packet flow: TestInternalExternalMasquerade masqueradeAll", masqueradeAll)
PACKET_FLOW_TEST("packet flow: TestInternalExternalMasquerade masqueradeAll, no LocalTrafficDetector",
                 masqueradeAllNoDetector)

// The ServiceCIDRs the scenarios rely on cross the ABI (snapshot_bridge → SnapshotView); a host
// table from before ABI 1.2 (shorter struct_size) has none, and the SDK does not read past it.
TEST_CASE("packet flow: ServiceCIDRs cross the plugin ABI only where struct_size covers them", "[unit]") {
  core::ChangeTracker tracker(core::TrackerConfig{});
  tracker.upsertServiceCIDR(core::ServiceCIDR{"kubernetes", "1", {"fd00:10:96::/112", "172.30.0.0/16"}});
  auto published = tracker.publish();
  const sdk::SnapshotView view(plugins::hostApi(), plugins::toC(published.snapshot.get()));
  CHECK(view.serviceCIDRs() == std::vector<sdk::ServiceCIDR>{{"kubernetes", "172.30.0.0/16"},
                                                             {"kubernetes", "fd00:10:96::/112"}});
  kproxy_host_api older = *plugins::hostApi();
  older.struct_size = offsetof(kproxy_host_api, snapshot_service_cidrs);
  const sdk::SnapshotView oldView(&older, plugins::toC(published.snapshot.get()));
  CHECK(oldView.serviceCIDRs().empty());
}
