#include "kproxy/apiwatch/kubeconfig.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "kproxy/apiwatch/decode.h"
#include "kproxy/core/log.h"
#include "kproxy/net/host_port.h"

namespace kproxy::apiwatch {
namespace {

namespace fs = std::filesystem;
using core::ErrorCategory;
using nlohmann::json;

// client-go's cached token file source re-reads at most once a minute; we also re-read as soon
// as the file visibly changed, which costs one stat per request.
constexpr std::int64_t kTokenRecheckNs = 60'000'000'000;

std::int64_t monotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

core::Result<std::string> readFile(const fs::path& path, std::string_view what) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return core::makeError(ErrorCategory::kNotFound, fmt::format("{} {}: no such file", what, path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) return core::makeError(ErrorCategory::kIo, fmt::format("{} {}: cannot open", what, path.string()), errno);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return core::makeError(ErrorCategory::kIo, fmt::format("{} {}: read failed", what, path.string()), errno);
  return buffer.str();
}

std::string trimmed(std::string s) {
  auto notSpace = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), notSpace));
  s.erase(std::find_if(s.rbegin(), s.rend(), notSpace).base(), s.end());
  return s;
}

/// A string member; absent or null → empty; another type is an error naming the path.
core::Result<std::string> stringField(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string{};
  if (!it->is_string())
    return core::makeError(ErrorCategory::kDecode, fmt::format("{}.{}: expected a string", where, key));
  return it->get<std::string>();
}

core::Result<bool> boolField(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return false;
  if (!it->is_boolean())
    return core::makeError(ErrorCategory::kDecode, fmt::format("{}.{}: expected a boolean", where, key));
  return it->get<bool>();
}

/// Finds `name` in a kubeconfig list of {name, <member>: {...}} and returns the member object.
core::Result<json> namedEntry(const json& root, const char* list, const char* member,
                              const std::string& name) {
  auto it = root.find(list);
  if (it != root.end() && it->is_array()) {
    for (const auto& entry : *it) {
      if (!entry.is_object()) continue;
      auto n = entry.find("name");
      if (n == entry.end() || !n->is_string() || n->get<std::string>() != name) continue;
      auto m = entry.find(member);
      if (m == entry.end() || m->is_null()) return json::object();
      if (!m->is_object())
        return core::makeError(ErrorCategory::kDecode,
                               fmt::format("{}[{}].{}: expected an object", list, name, member));
      return *m;
    }
  }
  return core::makeError(ErrorCategory::kNotFound, fmt::format("{} entry \"{}\" not found", member, name));
}

/// The PEM for `<key>-data` (base64) or `<key>` (a file, relative to `baseDir`); data wins, as
/// in client-go.
core::Result<std::string> pemField(const json& object, const std::string& key, const fs::path& baseDir,
                                   const std::string& where) {
  auto data = stringField(object, (key + "-data").c_str(), where);
  if (!data) return std::unexpected(data.error());
  if (!data->empty()) {
    auto decoded = decodeBase64(*data);
    if (!decoded)
      return core::makeError(ErrorCategory::kDecode, fmt::format("{}.{}-data: {}", where, key, decoded.error().context));
    return decoded;
  }
  auto file = stringField(object, key.c_str(), where);
  if (!file) return std::unexpected(file.error());
  if (file->empty()) return std::string{};
  fs::path path(*file);
  if (path.is_relative()) path = baseDir / path;
  return readFile(path, fmt::format("{}.{}", where, key));
}

}  // namespace

core::Result<std::string> decodeBase64(std::string_view text) {
  static constexpr auto kTable = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    constexpr std::string_view kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (std::size_t i = 0; i < kAlphabet.size(); ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int>(i);
    return t;
  }();
  std::string clean;
  clean.reserve(text.size());
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) clean.push_back(c);
  if (clean.size() % 4 != 0)
    return core::makeError(ErrorCategory::kDecode, "invalid base64: length is not a multiple of 4");
  std::string out;
  out.reserve(clean.size() / 4 * 3);
  for (std::size_t i = 0; i < clean.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      char c = clean[i + static_cast<std::size_t>(j)];
      if (c == '=') {
        // Padding only in the last quantum, only in its last two places, and not followed by data.
        if (i + 4 != clean.size() || j < 2)
          return core::makeError(ErrorCategory::kDecode, "invalid base64: misplaced padding");
        v[j] = 0;
        ++pad;
      } else {
        if (pad != 0) return core::makeError(ErrorCategory::kDecode, "invalid base64: data after padding");
        v[j] = kTable[static_cast<unsigned char>(c)];
        if (v[j] < 0)
          return core::makeError(ErrorCategory::kDecode, fmt::format("invalid base64: bad character at {}", i + static_cast<std::size_t>(j)));
      }
    }
    std::uint32_t n = (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
                      (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    out.push_back(static_cast<char>((n >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return out;
}

std::string metricsHost(const ServerUrl& server) { return net::joinHostPort(server.host, server.port); }

core::Result<ServerUrl> parseServerUrl(const std::string& url) {
  ServerUrl out;
  std::string_view rest = url;
  auto bad = [&](std::string_view why) {
    return core::makeError(ErrorCategory::kInvalidArgument, fmt::format("server URL \"{}\": {}", url, why));
  };
  if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
  } else if (rest.starts_with("http://")) {
    out.tls = false;
    out.port = 80;
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    return bad("scheme must be http or https");
  }
  auto slash = rest.find('/');
  std::string_view hostPort = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    std::string_view path = rest.substr(slash);
    while (path.ends_with('/')) path.remove_suffix(1);
    out.basePath = std::string(path);
  }
  std::string_view portText;
  if (hostPort.starts_with('[')) {
    auto close = hostPort.find(']');
    if (close == std::string_view::npos) return bad("unterminated IPv6 literal");
    out.host = std::string(hostPort.substr(1, close - 1));
    std::string_view after = hostPort.substr(close + 1);
    if (!after.empty()) {
      if (!after.starts_with(':')) return bad("junk after IPv6 literal");
      portText = after.substr(1);
    }
  } else {
    auto colon = hostPort.find(':');
    if (colon != std::string_view::npos && hostPort.find(':', colon + 1) != std::string_view::npos)
      return bad("IPv6 literals must be in brackets");
    out.host = std::string(hostPort.substr(0, colon));
    if (colon != std::string_view::npos) portText = hostPort.substr(colon + 1);
  }
  if (out.host.empty()) return bad("no host");
  if (!portText.empty()) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
    if (ec != std::errc{} || p != portText.data() + portText.size() || port == 0 || port > 65535)
      return bad("bad port");
    out.port = static_cast<std::uint16_t>(port);
  }
  return out;
}

std::shared_ptr<TokenSource> TokenSource::fixed(std::string token) {
  std::shared_ptr<TokenSource> source(new TokenSource());
  source->token_ = std::move(token);
  return source;
}

core::Result<std::shared_ptr<TokenSource>> TokenSource::fromFile(fs::path path) {
  auto text = readFile(path, "token file");
  if (!text) return std::unexpected(text.error());
  std::shared_ptr<TokenSource> source(new TokenSource());
  source->path_ = std::move(path);
  source->token_ = trimmed(std::move(*text));
  std::error_code ec;
  source->mtime_ = fs::last_write_time(source->path_, ec);
  source->size_ = fs::file_size(source->path_, ec);
  source->lastCheckNs_ = monotonicNs();
  return source;
}

std::string TokenSource::current() {
  std::lock_guard lock(mutex_);
  if (path_.empty()) return token_;
  std::error_code ec;
  auto mtime = fs::last_write_time(path_, ec);
  auto size = ec ? 0 : fs::file_size(path_, ec);
  auto now = monotonicNs();
  // The kubelet swaps projected tokens by renaming a directory symlink, so mtime (of the target
  // reached through the link) changes; the periodic re-read covers filesystems that hide it.
  bool changed = !ec && (mtime != mtime_ || size != size_);
  if (!changed && now - lastCheckNs_ < kTokenRecheckNs) return token_;
  lastCheckNs_ = now;
  auto text = readFile(path_, "token file");
  if (!text || trimmed(*text).empty()) {
    log::warning("cannot re-read token; keeping the previous one",
                 {{"file", path_.string()}, {"error", text ? "empty file" : text.error().message()}});
    return token_;
  }
  std::string fresh = trimmed(std::move(*text));
  if (fresh != token_) log::info(2, "token re-read after rotation", {{"file", path_.string()}});
  token_ = std::move(fresh);
  mtime_ = mtime;
  size_ = size;
  return token_;
}

core::Result<ClientConfig> loadKubeconfig(const fs::path& path, const std::string& masterOverride,
                                          const std::string& contextOverride) {
  auto text = readFile(path, "kubeconfig");
  if (!text) return std::unexpected(text.error());
  auto fail = [&](const core::Error& e) {
    return core::makeError(e.category, fmt::format("kubeconfig {}: {}", path.string(), e.context), e.errnum);
  };
  json root;
  try {
    YAML::Node node = YAML::Load(*text);
    auto converted = yamlToJson(node, text->size());
    if (!converted) return fail(converted.error());
    root = std::move(*converted);
  } catch (const YAML::Exception& e) {
    return core::makeError(ErrorCategory::kDecode, fmt::format("kubeconfig {}: {}", path.string(), e.what()));
  }
  if (!root.is_object()) return fail({ErrorCategory::kDecode, 0, "not a mapping"});

  std::string contextName = contextOverride;
  if (contextName.empty()) {
    auto current = stringField(root, "current-context", "");
    if (!current) return fail(current.error());
    contextName = *current;
  }
  // client-go accepts a config with a single cluster/user and no contexts only through
  // overrides; we require a current context, as kube-proxy effectively does.
  if (contextName.empty()) return fail({ErrorCategory::kInvalidArgument, 0, "no current-context"});
  auto context = namedEntry(root, "contexts", "context", contextName);
  if (!context) return fail(context.error());
  std::string where = fmt::format("contexts[{}]", contextName);
  auto clusterName = stringField(*context, "cluster", where);
  if (!clusterName) return fail(clusterName.error());
  auto userName = stringField(*context, "user", where);
  if (!userName) return fail(userName.error());
  if (clusterName->empty()) return fail({ErrorCategory::kInvalidArgument, 0, where + " names no cluster"});

  fs::path baseDir = path.parent_path();
  if (baseDir.empty()) baseDir = ".";
  ClientConfig config;
  config.origin = fmt::format("kubeconfig {} (context {})", path.string(), contextName);

  auto cluster = namedEntry(root, "clusters", "cluster", *clusterName);
  if (!cluster) return fail(cluster.error());
  where = fmt::format("clusters[{}]", *clusterName);
  auto server = stringField(*cluster, "server", where);
  if (!server) return fail(server.error());
  config.serverText = masterOverride.empty() ? *server : masterOverride;
  if (config.serverText.empty()) return fail({ErrorCategory::kInvalidArgument, 0, where + " has no server"});
  auto url = parseServerUrl(config.serverText);
  if (!url) return fail(url.error());
  config.server = std::move(*url);
  auto insecure = boolField(*cluster, "insecure-skip-tls-verify", where);
  if (!insecure) return fail(insecure.error());
  config.insecureSkipTlsVerify = *insecure;
  auto serverName = stringField(*cluster, "tls-server-name", where);
  if (!serverName) return fail(serverName.error());
  config.tlsServerName = *serverName;
  auto ca = pemField(*cluster, "certificate-authority", baseDir, where);
  if (!ca) return fail(ca.error());
  config.caPem = std::move(*ca);
  // client-go's transport.TLSConfigFor refuses this pair rather than let the flag silently
  // discard the CA the user thought protected the connection.
  if (config.insecureSkipTlsVerify && !config.caPem.empty())
    return fail({ErrorCategory::kInvalidArgument, 0,
                 where + ": specifying a root certificates file with the insecure flag is not supported"});

  if (!userName->empty()) {
    auto user = namedEntry(root, "users", "user", *userName);
    if (!user) return fail(user.error());
    where = fmt::format("users[{}]", *userName);
    auto cert = pemField(*user, "client-certificate", baseDir, where);
    if (!cert) return fail(cert.error());
    auto key = pemField(*user, "client-key", baseDir, where);
    if (!key) return fail(key.error());
    if (cert->empty() != key->empty())
      return fail({ErrorCategory::kInvalidArgument, 0, where + ": client-certificate and client-key go together"});
    config.clientCertPem = std::move(*cert);
    config.clientKeyPem = std::move(*key);
    auto token = stringField(*user, "token", where);
    if (!token) return fail(token.error());
    auto tokenFile = stringField(*user, "tokenFile", where);
    if (!tokenFile) return fail(tokenFile.error());
    if (!token->empty()) {
      config.token = TokenSource::fixed(trimmed(*token));
    } else if (!tokenFile->empty()) {
      fs::path tokenPath(*tokenFile);
      if (tokenPath.is_relative()) tokenPath = baseDir / tokenPath;
      auto source = TokenSource::fromFile(tokenPath);
      if (!source) return fail(source.error());
      config.token = std::move(*source);
    }
    auto username = stringField(*user, "username", where);
    if (!username) return fail(username.error());
    auto password = stringField(*user, "password", where);
    if (!password) return fail(password.error());
    config.username = *username;
    config.password = *password;
    for (const char* unsupported : {"exec", "auth-provider"}) {
      if (user->contains(unsupported) && !(*user)[unsupported].is_null())
        return fail({ErrorCategory::kInvalidArgument, 0,
                     fmt::format("{}.{}: credential plugins are not supported; use a token, tokenFile or client certificate", where, unsupported)});
    }
  }
  return config;
}

core::Result<void> checkCredentialTransport(const ClientConfig& config) {
  if (config.server.tls || config.allowHttpCredentials) return {};
  const char* what = config.token ? "a bearer token" : !config.username.empty() ? "a password" : nullptr;
  if (what == nullptr) return {};
  return core::makeError(ErrorCategory::kInvalidArgument,
                         fmt::format("{}: refusing to send {} in clear text to {}; use an https:// server, "
                                     "or pass --insecure-allow-http-credentials to allow it",
                                     config.origin.empty() ? "API client" : config.origin, what,
                                     config.serverText));
}

core::Result<ClientConfig> inClusterConfig(const InClusterEnvironment& environment) {
  auto getenv = environment.getenv ? environment.getenv : [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  auto host = getenv("KUBERNETES_SERVICE_HOST");
  auto port = getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !port || host->empty() || port->empty())
    return core::makeError(ErrorCategory::kNotFound,
                           "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set");
  ClientConfig config;
  config.origin = "in-cluster";
  bool v6 = host->find(':') != std::string::npos;
  config.serverText = fmt::format("https://{}{}{}:{}", v6 ? "[" : "", *host, v6 ? "]" : "", *port);
  auto url = parseServerUrl(config.serverText);
  if (!url) return std::unexpected(url.error());
  config.server = std::move(*url);
  auto token = TokenSource::fromFile(environment.serviceAccountDir / "token");
  if (!token) return std::unexpected(token.error());
  config.token = std::move(*token);
  // client-go logs and carries on without the CA (the system store then decides); same here.
  auto ca = readFile(environment.serviceAccountDir / "ca.crt", "service account CA");
  if (ca) {
    config.caPem = std::move(*ca);
  } else {
    log::warning("in-cluster CA not readable; using the system trust store", {{"error", ca.error().message()}});
  }
  return config;
}

core::Result<ClientConfig> resolveClientConfig(const std::string& kubeconfigPath, const std::string& master,
                                               const InClusterEnvironment& environment) {
  if (!kubeconfigPath.empty()) return loadKubeconfig(kubeconfigPath, master);
  if (!master.empty()) {
    ClientConfig config;
    config.origin = "--master";
    config.serverText = master;
    auto url = parseServerUrl(master);
    if (!url) return std::unexpected(url.error());
    config.server = std::move(*url);
    return config;
  }
  auto inCluster = inClusterConfig(environment);
  if (!inCluster && inCluster.error().category == ErrorCategory::kNotFound &&
      inCluster.error().context.starts_with("not running in a cluster"))
    return core::makeError(ErrorCategory::kNotFound,
                           "no API server configured: give --kubeconfig or --master, run in a Pod, "
                           "or use --manifests DIR");
  return inCluster;
}

}  // namespace kproxy::apiwatch
