#pragma once
/// Reading and writing KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) documents,
/// YAML or JSON, with upstream's camelCase field names and strict decoding.

#include <string>
#include <string_view>

#include "kproxy/core/error.h"
#include "proxy_config.h"

namespace kproxy::cli {

/// Decodes one KubeProxyConfiguration document (YAML, or JSON which is YAML). `source` names
/// the document in errors (normally the file path). Decoding is strict like upstream's: a wrong
/// apiVersion or kind, an unknown or duplicated field, a value of the wrong type or a bad
/// duration is an error naming the source and the field path, e.g.
///   /etc/kproxy.yaml: iptables.syncPeriod: invalid duration "3x": unknown unit ...
/// Upstream's scheme defaults are applied to what the document leaves unset (and, as upstream
/// does because Go cannot tell a zero duration from an absent one, to sync periods, QPS, burst
/// and contentType given as zero/empty). Platform defaults (see applyPlatformDefaults) are not
/// applied here. kproxy's process options stay at their defaults.
///
/// Lenient decoding (upstream's fallback, for documents written for another version) skips
/// unknown fields and takes the last of duplicated ones; every other error stays an error.
enum class Strictness { kStrict, kLenient };
core::Result<ProxyConfig> decodeConfig(std::string_view text, std::string_view source,
                                       Strictness strictness = Strictness::kStrict);

/// Reads `path` and decodes it as upstream's loadConfig does: strictly, and when that fails,
/// leniently, logging `Using lenient decoding as strict decoding failed` with the strict error
/// (kube-proxy's words); when both fail, the strict error.
core::Result<ProxyConfig> loadConfigFile(const std::string& path);

/// The KubeProxyConfiguration part of `config` as a JSON object with apiVersion and kind
/// (upstream's v1alpha1 shape; kproxy's process options are not part of it). Compact.
std::string toJson(const ProxyConfig& config);

/// What /configz serves: {"kubeproxy.config.k8s.io": <toJson(config)>}, as upstream.
std::string toConfigzJson(const ProxyConfig& config);

/// The same document as YAML, keys sorted as upstream's --write-config-to writes them.
/// decodeConfig(toYaml(c)) gives back c's KubeProxyConfiguration fields.
std::string toYaml(const ProxyConfig& config);

/// --write-config-to: writes toYaml(config) to `path` (created or truncated).
core::Result<void> writeConfigFile(const ProxyConfig& config, const std::string& path);

}  // namespace kproxy::cli
