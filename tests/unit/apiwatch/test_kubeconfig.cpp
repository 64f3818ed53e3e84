// Kubeconfig, in-cluster and --master resolution, on generated files in a temp directory.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "kproxy/apiwatch/kubeconfig.h"

namespace fs = std::filesystem;
using namespace kproxy::apiwatch;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kproxy-kubeconfig-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& content) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
    return p;
  }
};

// "-----BEGIN CERTIFICATE-----\nCA\n" in base64, used as opaque PEM bytes (not parsed here).
constexpr const char* kCaPem = "-----BEGIN CERTIFICATE-----\nCA\n";
constexpr const char* kCaPemBase64 = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCg==";

std::string kubeconfig(const std::string& clusterExtra, const std::string& userExtra,
                       const std::string& server = "https://10.1.2.3:6443") {
  return "apiVersion: v1\n"
         "kind: Config\n"
         "current-context: main\n"
         "contexts:\n"
         "- name: other\n"
         "  context: {cluster: c2, user: u2}\n"
         "- name: main\n"
         "  context:\n"
         "    cluster: c1\n"
         "    user: u1\n"
         "clusters:\n"
         "- name: c2\n"
         "  cluster: {server: 'https://other:1'}\n"
         "- name: c1\n"
         "  cluster:\n"
         "    server: " + server + "\n" + clusterExtra +
         "users:\n"
         "- name: u2\n"
         "  user: {token: other}\n"
         "- name: u1\n"
         "  user:\n" + userExtra;
}

}  // namespace

TEST_CASE("base64 decoding follows RFC 4648 and rejects bad input", "[unit]") {
  CHECK(decodeBase64("").value() == "");
  CHECK(decodeBase64("Zg==").value() == "f");
  CHECK(decodeBase64("Zm8=").value() == "fo");
  CHECK(decodeBase64("Zm9v").value() == "foo");
  CHECK(decodeBase64("Zm9v\nYmFy\n").value() == "foobar");
  CHECK_FALSE(decodeBase64("Zm9").has_value());
  CHECK_FALSE(decodeBase64("Z===").has_value());
  CHECK_FALSE(decodeBase64("Zm!v").has_value());
  CHECK_FALSE(decodeBase64("Zg==Zm9v").has_value());
}

TEST_CASE("server URLs: scheme, host, port, IPv6 and path prefix", "[unit]") {
  auto a = parseServerUrl("https://10.0.0.1:6443");
  REQUIRE(a);
  CHECK(*a == ServerUrl{true, "10.0.0.1", 6443, ""});
  auto b = parseServerUrl("http://localhost");
  REQUIRE(b);
  CHECK(*b == ServerUrl{false, "localhost", 80, ""});
  auto c = parseServerUrl("https://[fd00::1]:8443/prefix/");
  REQUIRE(c);
  CHECK(*c == ServerUrl{true, "fd00::1", 8443, "/prefix"});
  auto d = parseServerUrl("api.example.com");
  REQUIRE(d);
  CHECK(*d == ServerUrl{true, "api.example.com", 443, ""});
  CHECK_FALSE(parseServerUrl("ftp://x").has_value());
  CHECK_FALSE(parseServerUrl("https://fd00::1:443").has_value());
  CHECK_FALSE(parseServerUrl("https://x:0").has_value());
  CHECK_FALSE(parseServerUrl("https://x:70000").has_value());
  CHECK_FALSE(parseServerUrl("https://:443").has_value());
}

TEST_CASE("kubeconfig: current context picks cluster and user; inline data and token", "[unit]") {
  TempDir dir;
  auto path = dir.write("config", kubeconfig(std::string("    certificate-authority-data: ") + kCaPemBase64 + "\n",
                                             "    token: secret-token\n"));
  auto config = loadKubeconfig(path);
  REQUIRE(config);
  CHECK(config->server == ServerUrl{true, "10.1.2.3", 6443, ""});
  CHECK(config->caPem == kCaPem);
  CHECK_FALSE(config->insecureSkipTlsVerify);
  REQUIRE(config->token);
  CHECK(config->token->current() == "secret-token");
  CHECK(config->clientCertPem.empty());
  CHECK(config->origin.find("context main") != std::string::npos);

  SECTION("--master overrides the server but keeps the credentials") {
    auto overridden = loadKubeconfig(path, "https://192.168.0.9:7443");
    REQUIRE(overridden);
    CHECK(overridden->server == ServerUrl{true, "192.168.0.9", 7443, ""});
    REQUIRE(overridden->token);
    CHECK(overridden->token->current() == "secret-token");
  }
  SECTION("another context can be chosen") {
    auto other = loadKubeconfig(path, {}, "other");
    REQUIRE(other);
    CHECK(other->server.host == "other");
    CHECK(other->token->current() == "other");
  }
}

TEST_CASE("kubeconfig: file paths are relative to the kubeconfig; data wins over files", "[unit]") {
  TempDir dir;
  dir.write("pki/ca.crt", "CA FROM FILE");
  dir.write("pki/client.crt", "CERT FROM FILE");
  dir.write("pki/client.key", "KEY FROM FILE");
  dir.write("token", "  file-token\n");
  auto path = dir.write("sub/../config",
                        kubeconfig("    certificate-authority: pki/ca.crt\n",
                                   "    client-certificate: pki/client.crt\n"
                                   "    client-key: pki/client.key\n"
                                   "    tokenFile: token\n"));
  auto config = loadKubeconfig(path);
  REQUIRE(config);
  CHECK(config->caPem == "CA FROM FILE");
  CHECK_FALSE(config->insecureSkipTlsVerify);
  CHECK(config->clientCertPem == "CERT FROM FILE");
  CHECK(config->clientKeyPem == "KEY FROM FILE");
  REQUIRE(config->token);
  CHECK(config->token->current() == "file-token");

  auto both = dir.write("config2", kubeconfig(std::string("    certificate-authority: pki/ca.crt\n"
                                                          "    certificate-authority-data: ") +
                                                  kCaPemBase64 + "\n",
                                              "    client-certificate-data: Q0VSVA==\n"
                                              "    client-key-data: S0VZ\n"));
  auto dataWins = loadKubeconfig(both);
  REQUIRE(dataWins);
  CHECK(dataWins->caPem == kCaPem);
  CHECK(dataWins->clientCertPem == "CERT");
  CHECK(dataWins->clientKeyPem == "KEY");
  CHECK_FALSE(dataWins->token);
}

TEST_CASE("kubeconfig: a CA together with insecure-skip-tls-verify is refused, as client-go does", "[unit]") {
  TempDir dir;
  dir.write("ca.crt", "CA FROM FILE");
  for (const std::string& ca : {std::string("    certificate-authority: ca.crt\n"),
                                std::string("    certificate-authority-data: ") + kCaPemBase64 + "\n"}) {
    INFO(ca);
    auto path = dir.write("config", kubeconfig(ca + "    insecure-skip-tls-verify: true\n", "    token: t\n"));
    auto config = loadKubeconfig(path);
    REQUIRE_FALSE(config);
    INFO(config.error().message());
    CHECK(config.error().category == kproxy::core::ErrorCategory::kInvalidArgument);
    CHECK(config.error().message().find(path.string()) != std::string::npos);
    CHECK(config.error().message().find("clusters[c1]") != std::string::npos);
    CHECK(config.error().message().find(
              "specifying a root certificates file with the insecure flag is not supported") != std::string::npos);
  }
  SECTION("insecure-skip-tls-verify alone is still accepted") {
    auto path = dir.write("insecure", kubeconfig("    insecure-skip-tls-verify: true\n", "    token: t\n"));
    auto config = loadKubeconfig(path);
    REQUIRE(config);
    CHECK(config->insecureSkipTlsVerify);
    CHECK(config->caPem.empty());
  }
}

TEST_CASE("credentials are not sent over plain http unless the user opts in", "[unit]") {
  TempDir dir;
  dir.write("token", "file-token\n");
  for (const std::string& user : {std::string("    token: t\n"), std::string("    tokenFile: token\n"),
                                  std::string("    username: admin\n    password: secret\n")}) {
    INFO(user);
    auto path = dir.write("config", kubeconfig("", user, "http://10.1.2.3:8080"));
    auto config = loadKubeconfig(path);
    REQUIRE(config);
    auto refused = checkCredentialTransport(*config);
    REQUIRE_FALSE(refused);
    INFO(refused.error().message());
    CHECK(refused.error().category == kproxy::core::ErrorCategory::kInvalidArgument);
    CHECK(refused.error().message().find(path.string()) != std::string::npos);
    CHECK(refused.error().message().find("http://10.1.2.3:8080") != std::string::npos);
    CHECK(refused.error().message().find("--insecure-allow-http-credentials") != std::string::npos);

    config->allowHttpCredentials = true;
    CHECK(checkCredentialTransport(*config));
  }
  SECTION("https with a token, and http without credentials, need no opt-in") {
    auto https = loadKubeconfig(dir.write("https", kubeconfig("", "    token: t\n")));
    REQUIRE(https);
    CHECK(checkCredentialTransport(*https));
    auto anonymous = loadKubeconfig(dir.write("anon", kubeconfig("", "    {}\n", "http://10.1.2.3:8080")));
    REQUIRE(anonymous);
    CHECK(checkCredentialTransport(*anonymous));
  }
  SECTION("--master turning a kubeconfig's https into http is caught as well") {
    auto path = dir.write("master", kubeconfig("", "    token: t\n"));
    auto config = resolveClientConfig(path.string(), "http://127.0.0.1:8080");
    REQUIRE(config);
    CHECK_FALSE(checkCredentialTransport(*config));
  }
}

TEST_CASE("kubeconfig errors name the file and the entry", "[unit]") {
  TempDir dir;
  auto check = [&](const std::string& content, const std::string& expected) {
    auto path = dir.write("bad", content);
    auto config = loadKubeconfig(path);
    REQUIRE_FALSE(config);
    INFO(config.error().message());
    CHECK(config.error().message().find(path.string()) != std::string::npos);
    CHECK(config.error().message().find(expected) != std::string::npos);
  };
  check(kubeconfig("    certificate-authority: missing.crt\n", "    token: t\n"), "missing.crt");
  check(kubeconfig("    certificate-authority-data: '%%%'\n", "    token: t\n"), "certificate-authority-data");
  check(kubeconfig("", "    client-certificate-data: Q0VSVA==\n"), "go together");
  check(kubeconfig("", "    exec: {command: foo}\n"), "exec");
  check(kubeconfig("", "    token: t\n", "ftp://x"), "scheme");
  check("current-context: nope\ncontexts: []\n", "context entry \"nope\" not found");
  check("apiVersion: v1\nkind: Config\n", "no current-context");
  check("current-context: [unterminated\n", "");

  auto missing = loadKubeconfig(dir.path / "absent");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().category == kproxy::core::ErrorCategory::kNotFound);
}

TEST_CASE("in-cluster config from the environment and the service-account directory", "[unit]") {
  TempDir dir;
  dir.write("sa/token", "token-1\n");
  dir.write("sa/ca.crt", "IN-CLUSTER CA");
  std::map<std::string, std::string> env{{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
                                         {"KUBERNETES_SERVICE_PORT", "443"}};
  InClusterEnvironment environment{[&](const char* name) -> std::optional<std::string> {
                                     auto it = env.find(name);
                                     if (it == env.end()) return std::nullopt;
                                     return it->second;
                                   },
                                   dir.path / "sa"};
  auto config = inClusterConfig(environment);
  REQUIRE(config);
  CHECK(config->server == ServerUrl{true, "10.96.0.1", 443, ""});
  CHECK(config->caPem == "IN-CLUSTER CA");
  REQUIRE(config->token);
  CHECK(config->token->current() == "token-1");

  SECTION("a rotated token is picked up without restarting") {
    // Different size, so the change is seen even if the mtime granularity hides it.
    dir.write("sa/token", "token-number-2\n");
    CHECK(config->token->current() == "token-number-2");
    SECTION("a token file that turns empty keeps the last good token") {
      dir.write("sa/token", "");
      CHECK(config->token->current() == "token-number-2");
    }
  }
  SECTION("IPv6 service host is bracketed") {
    env["KUBERNETES_SERVICE_HOST"] = "fd00::1";
    auto v6 = inClusterConfig(environment);
    REQUIRE(v6);
    CHECK(v6->serverText == "https://[fd00::1]:443");
    CHECK(v6->server.host == "fd00::1");
  }
  SECTION("resolution order: kubeconfig, then --master, then in-cluster") {
    auto fromCluster = resolveClientConfig("", "", environment);
    REQUIRE(fromCluster);
    CHECK(fromCluster->origin == "in-cluster");
    auto fromMaster = resolveClientConfig("", "http://127.0.0.1:8080", environment);
    REQUIRE(fromMaster);
    CHECK(fromMaster->origin == "--master");
    CHECK(fromMaster->server == ServerUrl{false, "127.0.0.1", 8080, ""});
    CHECK_FALSE(fromMaster->token);
    auto kc = dir.write("kc", kubeconfig("", "    token: t\n"));
    auto fromFile = resolveClientConfig(kc.string(), "https://1.2.3.4", environment);
    REQUIRE(fromFile);
    CHECK(fromFile->server.host == "1.2.3.4");
    CHECK(fromFile->token->current() == "t");
  }
  SECTION("outside a cluster with nothing configured the error says what to give") {
    env.clear();
    auto none = resolveClientConfig("", "", environment);
    REQUIRE_FALSE(none);
    CHECK(none.error().category == kproxy::core::ErrorCategory::kNotFound);
    CHECK(none.error().message().find("--kubeconfig") != std::string::npos);
  }
  SECTION("missing token is an error") {
    fs::remove(dir.path / "sa/token");
    auto noToken = inClusterConfig(environment);
    REQUIRE_FALSE(noToken);
    CHECK(noToken.error().category == kproxy::core::ErrorCategory::kNotFound);
  }
}
