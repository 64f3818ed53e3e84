// deploy/: every manifest parses, holds what the DaemonSet needs, and the embedded
// KubeProxyConfiguration documents decode with kproxy's own strict decoder.
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

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
  CHECK(c["livenessProbe"]["httpGet"]["path"].as<std::string>() == "/livez");
  CHECK(c["livenessProbe"]["httpGet"]["port"].as<int>() == 10256);
  CHECK(c["readinessProbe"]["httpGet"]["path"].as<std::string>() == "/healthz");
  CHECK(c["readinessProbe"]["httpGet"]["port"].as<int>() == 10256);
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
