// deploy/: every manifest parses, holds what the DaemonSet needs, and the embedded
// KubeProxyConfiguration documents decode with kproxy's own strict decoder.
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "config_file.h"

namespace {

const std::string kDeploy = std::string(KPROXY_SOURCE_DIR) + "/deploy/";

std::map<std::string, YAML::Node> byKind(const std::string& file) {
  std::map<std::string, YAML::Node> out;
  for (const auto& doc : YAML::LoadAllFromFile(kDeploy + file)) {
    REQUIRE(doc["kind"]);
    out.emplace(doc["kind"].as<std::string>(), doc);
  }
  return out;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ruleAllows(const YAML::Node& rules, const std::string& group, const std::string& resource,
                const std::set<std::string>& verbs) {
  for (const auto& rule : rules) {
    bool groupOk = false, resourceOk = false;
    for (const auto& g : rule["apiGroups"]) groupOk |= g.as<std::string>() == group;
    for (const auto& r : rule["resources"]) resourceOk |= r.as<std::string>() == resource;
    if (!groupOk || !resourceOk) continue;
    std::set<std::string> have;
    for (const auto& v : rule["verbs"]) have.insert(v.as<std::string>());
    bool all = true;
    for (const auto& v : verbs) all &= have.count(v) == 1;
    if (all) return true;
  }
  return false;
}

// kubeadm's conventions for the proxy's probes: no readiness probe (/healthz is 503 on a node
// being deleted, and a readiness gate there stalls the rollout), and a liveness probe on /livez
// that outlasts the longest legitimate wait for a sync. /livez turns 503 once a change has
// waited 2 x syncPeriod (60 s by default); the longest wait BENCHMARKS.md measures is about 70 s
// (iptables mode, 30,000 Services x 10: a 68.3 s sync, then the change's own). The probe must
// let a change wait three times that before kubelet restarts kproxy.
void checkProbes(const YAML::Node& c) {
  CHECK_FALSE(c["readinessProbe"]);
  CHECK_FALSE(c["startupProbe"]);
  const auto live = c["livenessProbe"];
  REQUIRE(live);
  CHECK(live["httpGet"]["path"].as<std::string>() == "/livez");
  CHECK(live["httpGet"]["port"].as<int>() == 10256);
  constexpr int kHealthTimeout = 60;
  constexpr int kLongestLegitimateWait = 70;
  const int period = live["periodSeconds"].as<int>(10);
  const int failures = live["failureThreshold"].as<int>(3);
  CHECK(kHealthTimeout + period * failures >= 3 * kLongestLegitimateWait);
  CHECK(live["timeoutSeconds"].as<int>(1) < period);
}

}  // namespace

TEST_CASE("rbac: ServiceAccount, ClusterRole with the needed verbs, binding", "[unit][deploy]") {
  auto docs = byKind("rbac.yaml");
  REQUIRE(docs.count("ServiceAccount"));
  REQUIRE(docs.count("ClusterRole"));
  REQUIRE(docs.count("ClusterRoleBinding"));
  const auto rules = docs["ClusterRole"]["rules"];
  const std::set<std::string> read{"get", "list", "watch"};
  CHECK(ruleAllows(rules, "", "services", read));
  CHECK(ruleAllows(rules, "", "nodes", read));
  CHECK(ruleAllows(rules, "discovery.k8s.io", "endpointslices", read));
  CHECK(ruleAllows(rules, "networking.k8s.io", "servicecidrs", read));
  CHECK(ruleAllows(rules, "", "events", {"create", "patch"}));
  CHECK(ruleAllows(rules, "events.k8s.io", "events", {"create", "patch"}));
  const auto binding = docs["ClusterRoleBinding"];
  CHECK(binding["roleRef"]["name"].as<std::string>() == docs["ClusterRole"]["metadata"]["name"].as<std::string>());
  CHECK(binding["subjects"][0]["name"].as<std::string>() ==
        docs["ServiceAccount"]["metadata"]["name"].as<std::string>());
  CHECK(binding["subjects"][0]["namespace"].as<std::string>() == "kube-system");
}

TEST_CASE("configmap and example config decode as KubeProxyConfiguration in nftables mode", "[unit][deploy]") {
  auto docs = byKind("configmap.yaml");
  REQUIRE(docs.count("ConfigMap"));
  const std::string embedded = docs["ConfigMap"]["data"]["config.yaml"].as<std::string>();
  auto config = kproxy::cli::decodeConfig(embedded, "configmap.yaml:config.yaml");
  INFO((config ? "" : config.error().message()));
  REQUIRE(config);
  CHECK(config->mode == "nftables");
  CHECK(config->healthzBindAddress == "0.0.0.0:10256");

  auto hostConfig = kproxy::cli::decodeConfig(readFile(kDeploy + "config.yaml"), "config.yaml");
  INFO((hostConfig ? "" : hostConfig.error().message()));
  REQUIRE(hostConfig);
  CHECK(hostConfig->clientConnection.kubeconfig == "/etc/kubernetes/kproxy/kubeconfig");
}

TEST_CASE("deploy configs keep the metrics server (and /configz) on loopback, upstream's default", "[unit][deploy]") {
  // /configz on the metrics server shows the whole configuration; upstream kube-proxy (and
  // kproxy's flag) default metricsBindAddress to 127.0.0.1:10249, and the shipped files must not
  // widen that behind the user's back.
  auto docs = byKind("configmap.yaml");
  REQUIRE(docs.count("ConfigMap"));
  auto inCluster = kproxy::cli::decodeConfig(docs["ConfigMap"]["data"]["config.yaml"].as<std::string>(),
                                             "configmap.yaml:config.yaml");
  REQUIRE(inCluster);
  CHECK(inCluster->metricsBindAddress == "127.0.0.1:10249");
  auto host = kproxy::cli::decodeConfig(readFile(kDeploy + "config.yaml"), "config.yaml");
  REQUIRE(host);
  CHECK(host->metricsBindAddress == "127.0.0.1:10249");
  const kproxy::cli::ProxyConfig defaults;
  CHECK(defaults.metricsBindAddress == "127.0.0.1:10249");
}

TEST_CASE("daemonset: host network, privileged, mounts, tolerations, probes, node name", "[unit][deploy]") {
  auto docs = byKind("daemonset.yaml");
  REQUIRE(docs.count("DaemonSet"));
  const auto spec = docs["DaemonSet"]["spec"]["template"]["spec"];
  CHECK(spec["hostNetwork"].as<bool>());
  CHECK(spec["priorityClassName"].as<std::string>() == "system-node-critical");
  CHECK(spec["serviceAccountName"].as<std::string>() == byKind("rbac.yaml")["ServiceAccount"]["metadata"]["name"].as<std::string>());
  CHECK(spec["tolerations"][0]["operator"].as<std::string>() == "Exists");
  const auto c = spec["containers"][0];
  CHECK(c["securityContext"]["privileged"].as<bool>());
  checkProbes(c);
  std::string args;
  for (const auto& a : c["command"]) args += a.as<std::string>() + " ";
  CHECK(args.find("--config=") != std::string::npos);
  CHECK(args.find("--hostname-override=$(NODE_NAME)") != std::string::npos);
  CHECK(c["env"][0]["name"].as<std::string>() == "NODE_NAME");
  CHECK(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>() == "spec.nodeName");

  std::map<std::string, std::string> mounts;  // volume name -> mount path
  for (const auto& m : c["volumeMounts"]) mounts[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
  std::map<std::string, YAML::Node> volumes;
  for (const auto& v : spec["volumes"]) volumes.emplace(v["name"].as<std::string>(), YAML::Node(v));
  for (const auto& [name, path] : mounts) {
    INFO(name);
    CHECK(volumes.count(name) == 1);
  }
  CHECK(volumes.at("lib-modules")["hostPath"]["path"].as<std::string>() == "/lib/modules");
  CHECK(volumes.at("xtables-lock")["hostPath"]["path"].as<std::string>() == "/run/xtables.lock");
  CHECK(volumes.at("config")["configMap"]["name"].as<std::string>() ==
        byKind("configmap.yaml")["ConfigMap"]["metadata"]["name"].as<std::string>());
  bool libModulesReadOnly = false;
  for (const auto& m : c["volumeMounts"]) {
    if (m["name"].as<std::string>() == "lib-modules") libModulesReadOnly = m["readOnly"].as<bool>();
  }
  CHECK(libModulesReadOnly);
}

TEST_CASE("systemd unit runs kproxy with the host config and restarts", "[unit][deploy]") {
  const std::string unit = readFile(kDeploy + "kproxy.service");
  CHECK(unit.find("ExecStart=/usr/local/bin/kproxy --config /etc/kubernetes/kproxy/config.yaml\n") != std::string::npos);
  CHECK(unit.find("Restart=always\n") != std::string::npos);
  CHECK(unit.find("After=network-online.target\n") != std::string::npos);
  CHECK(unit.find("[Install]\nWantedBy=multi-user.target") != std::string::npos);
}

TEST_CASE("example kubeconfig uses client certificates", "[unit][deploy]") {
  const auto kc = YAML::LoadFile(kDeploy + "kubeconfig.example");
  CHECK(kc["kind"].as<std::string>() == "Config");
  CHECK(kc["users"][0]["user"]["client-certificate"]);
  CHECK(kc["users"][0]["user"]["client-key"]);
}

TEST_CASE("unprivileged daemonset: --init-only in a privileged initContainer, CAP_NET_ADMIN only in the "
          "main container, the same config", "[unit][deploy]") {
  auto docs = byKind("daemonset-unprivileged.yaml");
  REQUIRE(docs.count("DaemonSet"));
  const auto spec = docs["DaemonSet"]["spec"]["template"]["spec"];
  CHECK(spec["hostNetwork"].as<bool>());
  REQUIRE(spec["initContainers"].size() == 1);
  REQUIRE(spec["containers"].size() == 1);
  const auto init = spec["initContainers"][0];
  const auto main = spec["containers"][0];
  auto words = [](const YAML::Node& c) {
    std::vector<std::string> out;
    for (const auto& a : c["command"]) out.push_back(a.as<std::string>());
    return out;
  };
  const auto initWords = words(init);
  const auto mainWords = words(main);
  CHECK(std::count(initWords.begin(), initWords.end(), "--init-only") == 1);
  CHECK(std::count(mainWords.begin(), mainWords.end(), "--init-only") == 0);
  // The same configuration in both, so that the set-up is the one the proxy expects.
  std::vector<std::string> initRest;
  for (const auto& w : initWords)
    if (w != "--init-only") initRest.push_back(w);
  CHECK(initRest == mainWords);
  CHECK(init["securityContext"]["privileged"].as<bool>());
  const auto sc = main["securityContext"];
  CHECK_FALSE(sc["privileged"].as<bool>());
  CHECK_FALSE(sc["allowPrivilegeEscalation"].as<bool>());
  REQUIRE(sc["capabilities"]["add"].size() == 1);
  CHECK(sc["capabilities"]["add"][0].as<std::string>() == "NET_ADMIN");
  REQUIRE(sc["capabilities"]["drop"].size() == 1);
  CHECK(sc["capabilities"]["drop"][0].as<std::string>() == "ALL");
  checkProbes(main);
  std::map<std::string, YAML::Node> volumes;
  for (const auto& v : spec["volumes"]) volumes.emplace(v["name"].as<std::string>(), YAML::Node(v));
  CHECK(volumes.at("config")["configMap"]["name"].as<std::string>() ==
        byKind("configmap.yaml")["ConfigMap"]["metadata"]["name"].as<std::string>());
}

TEST_CASE("Dockerfile: the tools every mode runs, and the commit passed to the build", "[unit][deploy]") {
  const std::string dockerfile = readFile(kDeploy + "Dockerfile");
  const auto runtime = dockerfile.substr(dockerfile.rfind("\nFROM "));
  for (const char* package : {" iptables ", " nftables ", " ipset ", " ipvsadm ", " conntrack ", " iproute2 ", " kmod "}) {
    INFO(package);
    CHECK(runtime.find(package) != std::string::npos);
  }
  // The image build checks that the legacy and nft variants and each tool are there.
  for (const char* tool : {"iptables-legacy-restore", "iptables-nft-restore", "ipset", "ipvsadm", "nft ", "conntrack"}) {
    INFO(tool);
    CHECK(runtime.find(tool) != std::string::npos);
  }
  CHECK(dockerfile.find("ARG KPROXY_GIT_COMMIT") != std::string::npos);
  CHECK(dockerfile.find("-DKPROXY_GIT_COMMIT=\"${KPROXY_GIT_COMMIT}\"") != std::string::npos);
  CHECK(runtime.find("kproxy --version") != std::string::npos);
  // kubeadm's DaemonSet runs /usr/local/bin/kube-proxy: an image swap alone must start kproxy.
  CHECK(runtime.find("ln -s kproxy /usr/local/bin/kube-proxy") != std::string::npos);
}
