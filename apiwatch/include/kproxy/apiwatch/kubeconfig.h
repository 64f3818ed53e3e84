#pragma once
/// How to reach and authenticate to an API server: from a kubeconfig file, from the in-cluster
/// environment of a Pod, or from --master alone. Mirrors client-go's rules where users rely on
/// them (current-context, relative paths resolved against the kubeconfig's directory, *-data
/// taking precedence over the file form, --master overriding the server).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "kproxy/apiwatch/request_metrics.h"
#include "kproxy/core/error.h"

namespace kproxy::apiwatch {

/// A parsed API server URL: "https://10.0.0.1:6443/prefix" → {https, 10.0.0.1, 6443, /prefix}.
struct ServerUrl {
  bool tls = true;
  std::string host;      ///< without brackets for IPv6 literals
  std::uint16_t port = 443;
  std::string basePath;  ///< "" or a prefix without trailing slash, e.g. "/k8s"
  bool operator==(const ServerUrl&) const = default;
};

/// Parses "https://host[:port][/path]", "http://...", or a bare "host[:port]" (https assumed,
/// as client-go does). IPv6 literals must be bracketed. Fails with kInvalidArgument.
core::Result<ServerUrl> parseServerUrl(const std::string& url);

/// A bearer token that may change on disk (projected service-account tokens are rotated by the
/// kubelet). current() re-reads the file when its modification time or size changed, and at the
/// latest every minute, so a rotated token is picked up without restarting. Thread-safe.
class TokenSource {
 public:
  /// A fixed token (kubeconfig `token`).
  static std::shared_ptr<TokenSource> fixed(std::string token);
  /// A token read from a file (kubeconfig `tokenFile`, in-cluster token). The file is read
  /// once here so a missing file is reported at start-up (kNotFound / kIo).
  static core::Result<std::shared_ptr<TokenSource>> fromFile(std::filesystem::path path);

  /// The token to send. When a re-read fails, the last good token is kept and a warning logged.
  std::string current();
  /// The file the token comes from, empty for a fixed token.
  const std::filesystem::path& path() const { return path_; }

 private:
  TokenSource() = default;
  std::mutex mutex_;
  std::string token_;
  std::filesystem::path path_;
  std::filesystem::file_time_type mtime_{};
  std::uintmax_t size_ = 0;
  std::int64_t lastCheckNs_ = 0;
};

/// Everything the API client needs. PEM strings hold the bytes (never file names).
struct ClientConfig {
  ServerUrl server;
  std::string serverText;           ///< as configured, for log lines
  std::string caPem;                ///< empty: the system trust store
  bool insecureSkipTlsVerify = false;
  std::string tlsServerName;        ///< SNI / name to verify; empty: the server's host
  std::string clientCertPem;        ///< with clientKeyPem: TLS client authentication
  std::string clientKeyPem;
  std::shared_ptr<TokenSource> token;  ///< null: no bearer token
  std::string username;             ///< basic auth (rare; kubeconfig username/password)
  std::string password;
  float qps = 5.0f;                 ///< client-side rate limit (token bucket), <= 0: unlimited
  std::int32_t burst = 10;
  std::string origin;               ///< "kubeconfig /path (context x)", "in-cluster", "--master"
  /// The user's explicit opt-in (--insecure-allow-http-credentials) to send a bearer token or a
  /// password over plain http://, where anyone on the path can read and replay it.
  bool allowHttpCredentials = false;
  /// Receives every request's outcome (rest_client_* metrics); null: not reported.
  std::shared_ptr<RequestMetrics> requestMetrics;
};

/// The `host` label of the rest_client_* metrics: the server's host:port, as client-go's
/// base URL gives it (IPv6 literals bracketed).
std::string metricsHost(const ServerUrl& server);

/// Refuses (kInvalidArgument) a config that would send credentials (token, tokenFile or
/// username/password) to an http:// server, unless allowHttpCredentials is set. The message
/// names the origin, the server and the opt-in. ApiSource::start() checks it too.
core::Result<void> checkCredentialTransport(const ClientConfig& config);

/// Reads a kubeconfig (YAML or JSON) and resolves its current context (or `contextOverride`)
/// into a ClientConfig. Relative file paths are taken relative to the kubeconfig's directory.
/// A non-empty `masterOverride` replaces the cluster's server. Errors name the file and the
/// offending entry: missing context/cluster/user, unreadable certificate files, bad base64,
/// and (as client-go's transport) a certificate authority together with insecure-skip-tls-verify.
core::Result<ClientConfig> loadKubeconfig(const std::filesystem::path& path,
                                          const std::string& masterOverride = {},
                                          const std::string& contextOverride = {});

/// Where in-cluster configuration lives; injectable so tests need no Pod.
struct InClusterEnvironment {
  std::function<std::optional<std::string>(const char*)> getenv;  ///< default: std::getenv
  std::filesystem::path serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";
};

/// In-cluster configuration: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT with the
/// service account's ca.crt and (re-read on rotation) token. Fails with kNotFound when not
/// running in a Pod (either variable unset) or the token is missing.
core::Result<ClientConfig> inClusterConfig(const InClusterEnvironment& environment = {});

/// kube-proxy's precedence: a kubeconfig when given (with --master overriding its server);
/// otherwise --master alone (no credentials, http or https without verification data);
/// otherwise in-cluster. Fails with kNotFound when none of them is available.
core::Result<ClientConfig> resolveClientConfig(const std::string& kubeconfigPath,
                                               const std::string& master,
                                               const InClusterEnvironment& environment = {});

/// Standard base64 (RFC 4648, padding required, whitespace ignored). kDecode on bad input.
core::Result<std::string> decodeBase64(std::string_view text);

}  // namespace kproxy::apiwatch
