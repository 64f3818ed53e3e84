#include "config_file.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "kproxy/core/log.h"
#include "net_util.h"

namespace kproxy::cli {
namespace {

/// Where a config file holds what upstream's YAML reader (go-yaml) refuses before parsing:
/// bytes that are not well-formed UTF-8 (overlong forms, surrogates and code points above
/// U+10FFFF are ill-formed), or characters outside YAML's printable set (control characters
/// other than tab, LF and CR; DEL; C1 controls but NEL; U+FFFE and U+FFFF).
struct UnreadableByte {
  std::size_t offset;
  const char* what;
};

/// With `utf8Only`, only bytes that are not well-formed UTF-8 count (for decoded values, where
/// escapes may have produced control characters).
std::optional<UnreadableByte> firstUnreadableByte(std::string_view text, bool utf8Only = false) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) {
      if (!utf8Only && ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F))
        return UnreadableByte{i, "control character"};
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return UnreadableByte{i, "invalid UTF-8"};
    }
    if (i + length > text.size()) return UnreadableByte{i, "invalid UTF-8"};
    for (std::size_t k = 1; k < length; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (b < low || b > high) : (b < 0x80 || b > 0xBF))
        return UnreadableByte{i, "invalid UTF-8"};
    }
    const auto second = static_cast<unsigned char>(text[i + 1]);
    if (utf8Only) {
      i += length;
      continue;
    }
    if (c == 0xC2 && second < 0xA0 && second != 0x85) return UnreadableByte{i, "control character"};
    if (c == 0xEF && second == 0xBF && static_cast<unsigned char>(text[i + 2]) >= 0xBE)
      return UnreadableByte{i, "non-character"};
    i += length;
  }
  return std::nullopt;
}

using core::ErrorCategory;
using core::makeError;
using Json = nlohmann::json;

// How a plain (unquoted) YAML scalar resolves, following YAML 1.1 as go-yaml v2 (used by
// upstream's sigs.k8s.io/yaml) does. Quoted scalars are always strings.
enum class PlainType { kString, kNull, kBool, kInt, kFloat };

std::optional<bool> parseYamlBool(std::string_view s) {
  for (std::string_view t : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
    if (s == t) return true;
  }
  for (std::string_view f : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
    if (s == f) return false;
  }
  return std::nullopt;
}

std::optional<std::int64_t> parseInt(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

std::optional<double> parseFloat(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return std::nullopt;
  double value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

PlainType classifyPlain(std::string_view s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return PlainType::kNull;
  if (parseYamlBool(s)) return PlainType::kBool;
  if (parseInt(s)) return PlainType::kInt;
  if (s == ".inf" || s == "-.inf" || s == ".nan" || s == ".Inf" || s == ".NaN") return PlainType::kFloat;
  // from_chars accepts "inf"/"nan", which YAML reads as strings.
  if (s.find_first_of("0123456789") != std::string_view::npos && parseFloat(s)) return PlainType::kFloat;
  return PlainType::kString;
}

bool isPlain(const YAML::Node& node) { return node.Tag() == "?"; }

const char* describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "an object";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "null";
    default:
      break;
  }
  if (!isPlain(node)) return "a string";
  switch (classifyPlain(node.Scalar())) {
    case PlainType::kBool:
      return "a bool";
    case PlainType::kInt:
    case PlainType::kFloat:
      return "a number";
    case PlainType::kNull:
      return "null";
    case PlainType::kString:
      break;
  }
  return "a string";
}

// Strict decoder: every reader returns false after recording one error line.
class Decoder {
 public:
  Decoder(std::string_view source, bool lenient) : source_(source), lenient_(lenient) {}

  std::string error;

  bool fail(const std::string& path, const std::string& what) {
    error = path.empty() ? fmt::format("{}: {}", source_, what)
                         : fmt::format("{}: {}: {}", source_, path, what);
    return false;
  }
  bool typeError(const std::string& path, const YAML::Node& node, const char* want) {
    return fail(path, fmt::format("must be {}, got {}", want, describe(node)));
  }

  bool readString(const YAML::Node& node, const std::string& path, std::string& out) {
    if (!node.IsScalar()) return typeError(path, node, "a string");
    if (isPlain(node) && classifyPlain(node.Scalar()) != PlainType::kString) {
      return typeError(path, node, "a string");
    }
    // yaml-cpp decodes the escapes \N and \_ to the Latin-1 bytes 0x85 and 0xA0, not to
    // UTF-8; such a value could not be written back (--write-config-to) as it was read.
    if (firstUnreadableByte(node.Scalar(), /*utf8Only=*/true)) {
      return fail(path, "must be valid UTF-8 (write the escapes \\N and \\_ as \\u0085 and \\u00A0)");
    }
    out = node.Scalar();
    return true;
  }

  bool readBool(const YAML::Node& node, const std::string& path, bool& out) {
    if (!node.IsScalar() || !isPlain(node)) return typeError(path, node, "a bool");
    const auto value = parseYamlBool(node.Scalar());
    if (!value) return typeError(path, node, "a bool");
    out = *value;
    return true;
  }

  bool readInt32(const YAML::Node& node, const std::string& path, std::int32_t& out) {
    if (!node.IsScalar() || !isPlain(node)) return typeError(path, node, "an integer");
    const auto value = parseInt(node.Scalar());
    if (!value) return typeError(path, node, "an integer");
    if (*value < std::numeric_limits<std::int32_t>::min() ||
        *value > std::numeric_limits<std::int32_t>::max()) {
      return fail(path, fmt::format("{} is out of range for a 32-bit integer", node.Scalar()));
    }
    out = static_cast<std::int32_t>(*value);
    return true;
  }

  bool readUint32(const YAML::Node& node, const std::string& path, std::uint32_t& out) {
    std::int32_t value = 0;
    if (!readInt32(node, path, value)) return false;
    if (value < 0) return fail(path, fmt::format("must not be negative, got {}", value));
    out = static_cast<std::uint32_t>(value);
    return true;
  }

  bool readFloat(const YAML::Node& node, const std::string& path, float& out) {
    if (!node.IsScalar() || !isPlain(node)) return typeError(path, node, "a number");
    const auto value = parseFloat(node.Scalar());
    if (!value || classifyPlain(node.Scalar()) == PlainType::kString) {
      return typeError(path, node, "a number");
    }
    out = static_cast<float>(*value);
    return true;
  }

  bool readDuration(const YAML::Node& node, const std::string& path, Duration& out) {
    std::string text;
    if (!node.IsScalar()) return typeError(path, node, "a duration string such as \"30s\"");
    text = node.Scalar();
    auto parsed = parseGoDuration(text);
    if (!parsed) {
      return fail(path, fmt::format("invalid duration \"{}\": {} (examples: 30s, 1m30s, 500ms, 2h)",
                                    text, parsed.error().context));
    }
    out = *parsed;
    return true;
  }

  bool readStringList(const YAML::Node& node, const std::string& path,
                      std::vector<std::string>& out) {
    if (!node.IsSequence()) return typeError(path, node, "a list of strings");
    std::vector<std::string> values;
    for (std::size_t i = 0; i < node.size(); ++i) {
      std::string value;
      if (!readString(node[i], fmt::format("{}[{}]", path, i), value)) return false;
      values.push_back(std::move(value));
    }
    out = std::move(values);
    return true;
  }

  // Reads a mapping field by field. A handler is called only for non-null values: null means
  // "unset", as for Go's pointer and zero-value fields, so the default stays.
  using Handler = std::function<bool(const YAML::Node&, const std::string&)>;
  using Fields = std::vector<std::pair<std::string_view, Handler>>;

  bool readObject(const YAML::Node& node, const std::string& path, const Fields& fields) {
    if (node.IsNull()) return true;
    if (!node.IsMap()) return typeError(path, node, "an object");
    std::set<std::string> seen;
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string("?");
      const std::string child = path.empty() ? key : path + "." + key;
      // Lenient decoding (upstream's fallback) takes the last of duplicated fields and skips
      // unknown ones, as a decoder without strictness does.
      if (!seen.insert(key).second && !lenient_) return fail("", fmt::format("duplicate field \"{}\"", child));
      const Handler* handler = nullptr;
      for (const auto& [name, h] : fields) {
        if (name == key) handler = &h;
      }
      if (handler == nullptr) {
        if (lenient_) continue;
        return fail("", fmt::format("unknown field \"{}\"", child));
      }
      if (entry.second.IsNull()) continue;
      if (!(*handler)(entry.second, child)) return false;
    }
    return true;
  }

  // Handler helpers, so the field tables below read as name -> destination.
  Handler str(std::string& out) {
    return [this, &out](const YAML::Node& n, const std::string& p) { return readString(n, p, out); };
  }
  Handler boolean(bool& out) {
    return [this, &out](const YAML::Node& n, const std::string& p) { return readBool(n, p, out); };
  }
  Handler int32(std::int32_t& out) {
    return [this, &out](const YAML::Node& n, const std::string& p) { return readInt32(n, p, out); };
  }
  Handler duration(Duration& out) {
    return [this, &out](const YAML::Node& n, const std::string& p) { return readDuration(n, p, out); };
  }
  Handler strings(std::vector<std::string>& out) {
    return [this, &out](const YAML::Node& n, const std::string& p) {
      return readStringList(n, p, out);
    };
  }
  Handler object(Fields fields) {
    return [this, fields = std::move(fields)](const YAML::Node& n, const std::string& p) {
      return readObject(n, p, fields);
    };
  }
  // Fields that kproxy accepts for compatibility but does not use (Windows options, logging
  // options): any value is accepted.
  static Handler ignored() {
    return [](const YAML::Node&, const std::string&) { return true; };
  }

 private:
  std::string source_;
  bool lenient_;
};

// The document as written, before defaulting: the fields whose defaults depend on presence.
struct Presence {
  std::optional<bool> iptablesMasqueradeAll;
  std::optional<bool> nftablesMasqueradeAll;
};

}  // namespace

core::Result<ProxyConfig> decodeConfig(std::string_view text, std::string_view source, Strictness strictness) {
  // Upstream's YAML reader refuses such a document; yaml-cpp would take the bytes into names
  // and addresses as they are.
  if (auto bad = firstUnreadableByte(text)) {
    return makeError(ErrorCategory::kDecode,
                     fmt::format("{}: {} at byte offset {}", source, bad->what, bad->offset));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return makeError(ErrorCategory::kDecode,
                     fmt::format("{}: line {} column {}: {}", source, e.mark.line + 1,
                                 e.mark.column + 1, e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return makeError(ErrorCategory::kDecode, fmt::format("{}: empty document", source));
  }
  if (!root.IsMap()) {
    return makeError(ErrorCategory::kDecode,
                     fmt::format("{}: must be a KubeProxyConfiguration object, got {}", source,
                                 describe(root)));
  }

  // Start from "unset": zero values that upstream's defaulting then fills.
  ProxyConfig c;
  c.mode.clear();
  c.bindAddress.clear();
  c.healthzBindAddress.clear();
  c.metricsBindAddress.clear();
  c.iptables.syncPeriod = c.iptables.minSyncPeriod = Duration{0};
  c.nftables.syncPeriod = c.nftables.minSyncPeriod = Duration{0};
  c.ipvs.syncPeriod = Duration{0};
  c.configSyncPeriod = Duration{0};
  c.clientConnection.contentType.clear();
  c.clientConnection.qps = 0;
  c.clientConnection.burst = 0;

  std::string apiVersion;
  std::string kind;
  Presence presence;
  bool iptablesMasq = false;
  bool nftablesMasq = false;

  Decoder d(source, strictness == Strictness::kLenient);
  using F = Decoder::Fields;
  const F fields = {
      {"apiVersion", d.str(apiVersion)},
      {"kind", d.str(kind)},
      {"featureGates",
       [&](const YAML::Node& n, const std::string& p) {
         if (!n.IsMap()) return d.typeError(p, n, "a map of feature names to bools");
         std::map<std::string, bool> gates;
         for (const auto& e : n) {
           const std::string name = e.first.Scalar();
           if (firstUnreadableByte(name, /*utf8Only=*/true))  // see readString
             return d.fail(p, "feature names must be valid UTF-8");
           bool value = false;
           if (!d.readBool(e.second, p + "." + name, value)) return false;
           gates[name] = value;
         }
         c.featureGates = std::move(gates);
         return true;
       }},
      {"clientConnection",
       d.object(F{{"kubeconfig", d.str(c.clientConnection.kubeconfig)},
                  {"acceptContentTypes", d.str(c.clientConnection.acceptContentTypes)},
                  {"contentType", d.str(c.clientConnection.contentType)},
                  {"qps",
                   [&](const YAML::Node& n, const std::string& p) {
                     return d.readFloat(n, p, c.clientConnection.qps);
                   }},
                  {"burst", d.int32(c.clientConnection.burst)}})},
      {"logging",
       d.object(F{{"format", d.str(c.logging.format)},
                  {"flushFrequency",
                   // logsapi's TimeOrMetaDuration: a duration string or integer nanoseconds.
                   [&](const YAML::Node& n, const std::string& p) {
                     if (n.IsScalar() && isPlain(n) && parseInt(n.Scalar())) {
                       c.logging.flushFrequency = Duration{*parseInt(n.Scalar())};
                       return true;
                     }
                     return d.readDuration(n, p, c.logging.flushFrequency);
                   }},
                  {"verbosity",
                   [&](const YAML::Node& n, const std::string& p) {
                     return d.readUint32(n, p, c.logging.verbosity);
                   }},
                  {"vmodule", Decoder::ignored()},
                  {"options", Decoder::ignored()}})},
      {"hostnameOverride", d.str(c.hostnameOverride)},
      {"bindAddress", d.str(c.bindAddress)},
      {"healthzBindAddress", d.str(c.healthzBindAddress)},
      {"metricsBindAddress", d.str(c.metricsBindAddress)},
      {"bindAddressHardFail", d.boolean(c.bindAddressHardFail)},
      {"enableProfiling", d.boolean(c.enableProfiling)},
      {"showHiddenMetricsForVersion", d.str(c.showHiddenMetricsForVersion)},
      {"mode", d.str(c.mode)},
      {"iptables",
       d.object(F{{"masqueradeBit", d.int32(c.iptables.masqueradeBit)},
                  {"masqueradeAll",
                   [&](const YAML::Node& n, const std::string& p) {
                     if (!d.readBool(n, p, iptablesMasq)) return false;
                     presence.iptablesMasqueradeAll = iptablesMasq;
                     return true;
                   }},
                  {"localhostNodePorts", d.boolean(c.iptables.localhostNodePorts)},
                  {"snatNodeInternalIP", d.boolean(c.iptables.snatNodeInternalIP)},
                  {"syncPeriod", d.duration(c.iptables.syncPeriod)},
                  {"minSyncPeriod", d.duration(c.iptables.minSyncPeriod)}})},
      {"ipvs",
       d.object(F{{"syncPeriod", d.duration(c.ipvs.syncPeriod)},
                  {"minSyncPeriod", d.duration(c.ipvs.minSyncPeriod)},
                  {"scheduler", d.str(c.ipvs.scheduler)},
                  {"excludeCIDRs", d.strings(c.ipvs.excludeCIDRs)},
                  {"strictARP", d.boolean(c.ipvs.strictARP)},
                  {"tcpTimeout", d.duration(c.ipvs.tcpTimeout)},
                  {"tcpFinTimeout", d.duration(c.ipvs.tcpFinTimeout)},
                  {"udpTimeout", d.duration(c.ipvs.udpTimeout)}})},
      {"nftables",
       d.object(F{{"masqueradeBit", d.int32(c.nftables.masqueradeBit)},
                  {"masqueradeAll",
                   [&](const YAML::Node& n, const std::string& p) {
                     if (!d.readBool(n, p, nftablesMasq)) return false;
                     presence.nftablesMasqueradeAll = nftablesMasq;
                     return true;
                   }},
                  {"syncPeriod", d.duration(c.nftables.syncPeriod)},
                  {"minSyncPeriod", d.duration(c.nftables.minSyncPeriod)}})},
      {"winkernel",
       d.object(F{{"networkName", Decoder::ignored()},
                  {"sourceVip", Decoder::ignored()},
                  {"enableDSR", Decoder::ignored()},
                  {"rootHnsEndpointName", Decoder::ignored()},
                  {"forwardHealthCheckVip", Decoder::ignored()}})},
      {"detectLocalMode", d.str(c.detectLocalMode)},
      {"detectLocal",
       d.object(F{{"bridgeInterface", d.str(c.detectLocal.bridgeInterface)},
                  {"interfaceNamePrefix", d.str(c.detectLocal.interfaceNamePrefix)}})},
      {"clusterCIDR", d.str(c.clusterCIDR)},
      {"nodePortAddresses", d.strings(c.nodePortAddresses)},
      {"oomScoreAdj", d.int32(c.oomScoreAdj)},
      {"conntrack",
       d.object(F{{"maxPerCore", d.int32(c.conntrack.maxPerCore)},
                  {"min", d.int32(c.conntrack.min)},
                  {"tcpEstablishedTimeout", d.duration(c.conntrack.tcpEstablishedTimeout)},
                  {"tcpCloseWaitTimeout", d.duration(c.conntrack.tcpCloseWaitTimeout)},
                  {"tcpBeLiberal", d.boolean(c.conntrack.tcpBeLiberal)},
                  {"udpTimeout", d.duration(c.conntrack.udpTimeout)},
                  {"udpStreamTimeout", d.duration(c.conntrack.udpStreamTimeout)}})},
      {"configSyncPeriod", d.duration(c.configSyncPeriod)},
      {"portRange", d.str(c.portRange)},
      {"windowsRunAsService", Decoder::ignored()},
  };

  // apiVersion and kind first, so that a document of another type is reported as such rather
  // than by its first unknown field.
  const auto checkTypeMeta = [&]() -> core::Result<void> {
    const YAML::Node av = root["apiVersion"];
    const YAML::Node k = root["kind"];
    if (!av.IsDefined() || av.IsNull()) {
      return makeError(ErrorCategory::kDecode,
                       fmt::format("{}: apiVersion is missing (want {})", source, kApiVersion));
    }
    if (!k.IsDefined() || k.IsNull()) {
      return makeError(ErrorCategory::kDecode,
                       fmt::format("{}: kind is missing (want {})", source, kKind));
    }
    if (!av.IsScalar() || av.Scalar() != kApiVersion) {
      return makeError(ErrorCategory::kDecode,
                       fmt::format("{}: apiVersion \"{}\" is not supported (want {})", source,
                                   av.IsScalar() ? av.Scalar() : describe(av), kApiVersion));
    }
    if (!k.IsScalar() || k.Scalar() != kKind) {
      return makeError(ErrorCategory::kDecode,
                       fmt::format("{}: kind \"{}\" is not supported (want {})", source,
                                   k.IsScalar() ? k.Scalar() : describe(k), kKind));
    }
    return {};
  };
  if (auto ok = checkTypeMeta(); !ok) return std::unexpected(ok.error());
  if (!d.readObject(root, "", fields)) return makeError(ErrorCategory::kDecode, d.error);

  // Upstream's scheme defaults (pkg/proxy/apis/config/v1alpha1/defaults.go).
  const ProxyConfig defaults;
  if (c.bindAddress.empty()) c.bindAddress = defaults.bindAddress;
  const bool v4 = ipFamilyOf(c.bindAddress) != net::Family::kIPv6;
  if (c.healthzBindAddress.empty()) {
    c.healthzBindAddress = fmt::format("{}:{}", v4 ? "0.0.0.0" : "[::]", kProxyHealthzPort);
  } else {
    c.healthzBindAddress = appendPortIfNeeded(c.healthzBindAddress, kProxyHealthzPort);
  }
  if (c.metricsBindAddress.empty()) {
    c.metricsBindAddress = fmt::format("{}:{}", v4 ? "127.0.0.1" : "[::1]", kProxyMetricsPort);
  } else {
    c.metricsBindAddress = appendPortIfNeeded(c.metricsBindAddress, kProxyMetricsPort);
  }
  auto defaultIfZero = [](Duration& value, Duration fallback) {
    if (value == Duration{0}) value = fallback;
  };
  defaultIfZero(c.iptables.syncPeriod, defaults.iptables.syncPeriod);
  defaultIfZero(c.iptables.minSyncPeriod, defaults.iptables.minSyncPeriod);
  defaultIfZero(c.nftables.syncPeriod, defaults.nftables.syncPeriod);
  defaultIfZero(c.nftables.minSyncPeriod, defaults.nftables.minSyncPeriod);
  defaultIfZero(c.ipvs.syncPeriod, defaults.ipvs.syncPeriod);
  defaultIfZero(c.configSyncPeriod, defaults.configSyncPeriod);
  // logsapi.SetRecommendedLoggingConfiguration, which upstream's defaulting calls: a zero
  // flushFrequency (kubeadm's config.conf writes `flushFrequency: 0`) and an empty format.
  defaultIfZero(c.logging.flushFrequency, defaults.logging.flushFrequency);
  if (c.logging.format.empty()) c.logging.format = defaults.logging.format;
  if (c.clientConnection.contentType.empty()) {
    c.clientConnection.contentType = defaults.clientConnection.contentType;
  }
  if (c.clientConnection.qps == 0.0f) c.clientConnection.qps = defaults.clientConnection.qps;
  if (c.clientConnection.burst == 0) c.clientConnection.burst = defaults.clientConnection.burst;

  // masqueradeAll lives in the section of the mode that uses it (upstream's v1alpha1
  // conversion); kproxy's toYaml writes it to both, so either is accepted when only one is set.
  const std::string effectiveMode = c.mode.empty() ? std::string(kDefaultProxyMode) : c.mode;
  const auto& primary = effectiveMode == "nftables" ? presence.nftablesMasqueradeAll
                                                    : presence.iptablesMasqueradeAll;
  const auto& other = effectiveMode == "nftables" ? presence.iptablesMasqueradeAll
                                                  : presence.nftablesMasqueradeAll;
  c.masqueradeAll = primary.value_or(other.value_or(false));
  return c;
}

core::Result<ProxyConfig> loadConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return makeError(ErrorCategory::kNotFound, fmt::format("reading config file {}", path), errno);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return makeError(ErrorCategory::kIo, fmt::format("reading config file {}", path), errno);
  // upstream's loadConfig: strict decoding first; when it fails, lenient decoding, with a
  // warning, and the strict error when that fails too.
  auto strict = decodeConfig(buffer.str(), path, Strictness::kStrict);
  if (strict) return strict;
  auto lenient = decodeConfig(buffer.str(), path, Strictness::kLenient);
  if (!lenient) return strict;
  log::info(0, "Using lenient decoding as strict decoding failed", {{"err", strict.error().message()}});
  return lenient;
}

namespace {

Json toJsonValue(const ProxyConfig& c) {
  auto dur = [](Duration d) { return formatGoDuration(d); };
  auto list = [](const std::vector<std::string>& v) -> Json {
    return v.empty() ? Json(nullptr) : Json(v);  // Go's nil slice
  };
  Json j = Json::object();
  j["apiVersion"] = kApiVersion;
  j["kind"] = kKind;
  j["bindAddress"] = c.bindAddress;
  j["bindAddressHardFail"] = c.bindAddressHardFail;
  j["clientConnection"] = {{"acceptContentTypes", c.clientConnection.acceptContentTypes},
                           {"burst", c.clientConnection.burst},
                           {"contentType", c.clientConnection.contentType},
                           {"kubeconfig", c.clientConnection.kubeconfig},
                           {"qps", c.clientConnection.qps}};
  j["clusterCIDR"] = c.clusterCIDR;
  j["configSyncPeriod"] = dur(c.configSyncPeriod);
  j["conntrack"] = {{"maxPerCore", c.conntrack.maxPerCore},
                    {"min", c.conntrack.min},
                    {"tcpBeLiberal", c.conntrack.tcpBeLiberal},
                    {"tcpCloseWaitTimeout", dur(c.conntrack.tcpCloseWaitTimeout)},
                    {"tcpEstablishedTimeout", dur(c.conntrack.tcpEstablishedTimeout)},
                    {"udpStreamTimeout", dur(c.conntrack.udpStreamTimeout)},
                    {"udpTimeout", dur(c.conntrack.udpTimeout)}};
  j["detectLocal"] = {{"bridgeInterface", c.detectLocal.bridgeInterface},
                      {"interfaceNamePrefix", c.detectLocal.interfaceNamePrefix}};
  j["detectLocalMode"] = c.detectLocalMode;
  j["enableProfiling"] = c.enableProfiling;
  if (!c.featureGates.empty()) j["featureGates"] = c.featureGates;  // omitempty upstream
  j["healthzBindAddress"] = c.healthzBindAddress;
  j["hostnameOverride"] = c.hostnameOverride;
  j["iptables"] = {{"localhostNodePorts", c.iptables.localhostNodePorts},
                   {"masqueradeAll", c.masqueradeAll},
                   {"masqueradeBit", c.iptables.masqueradeBit},
                   {"minSyncPeriod", dur(c.iptables.minSyncPeriod)},
                   {"snatNodeInternalIP", c.iptables.snatNodeInternalIP},
                   {"syncPeriod", dur(c.iptables.syncPeriod)}};
  j["ipvs"] = {{"excludeCIDRs", list(c.ipvs.excludeCIDRs)},
               {"minSyncPeriod", dur(c.ipvs.minSyncPeriod)},
               {"scheduler", c.ipvs.scheduler},
               {"strictARP", c.ipvs.strictARP},
               {"syncPeriod", dur(c.ipvs.syncPeriod)},
               {"tcpFinTimeout", dur(c.ipvs.tcpFinTimeout)},
               {"tcpTimeout", dur(c.ipvs.tcpTimeout)},
               {"udpTimeout", dur(c.ipvs.udpTimeout)}};
  j["logging"] = {{"flushFrequency", dur(c.logging.flushFrequency)},
                  {"format", c.logging.format},
                  {"verbosity", c.logging.verbosity}};
  j["metricsBindAddress"] = c.metricsBindAddress;
  j["mode"] = c.mode;
  j["nftables"] = {{"masqueradeAll", c.masqueradeAll},
                   {"masqueradeBit", c.nftables.masqueradeBit},
                   {"minSyncPeriod", dur(c.nftables.minSyncPeriod)},
                   {"syncPeriod", dur(c.nftables.syncPeriod)}};
  j["nodePortAddresses"] = list(c.nodePortAddresses);
  j["oomScoreAdj"] = c.oomScoreAdj;
  j["portRange"] = c.portRange;
  j["showHiddenMetricsForVersion"] = c.showHiddenMetricsForVersion;
  j["winkernel"] = {{"enableDSR", false},
                    {"forwardHealthCheckVip", false},
                    {"networkName", ""},
                    {"rootHnsEndpointName", ""},
                    {"sourceVip", ""}};
  return j;
}

// A string that a YAML reader would take for something else when written plain.
bool needsQuotes(const std::string& s) {
  if (classifyPlain(s) != PlainType::kString) return true;
  if (s.front() == ' ' || s.back() == ' ') return true;
  // A plain scalar cannot carry control characters (a CR or tab at its end is read back as
  // a line break or dropped); only the escapes of a double-quoted one keep them.
  return std::any_of(s.begin(), s.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
  });
}

void emitYaml(YAML::Emitter& out, const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      if (value.empty()) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        break;
      }
      out << YAML::BeginMap;
      for (const auto& [key, child] : value.items()) {
        out << YAML::Key << key << YAML::Value;
        emitYaml(out, child);
      }
      out << YAML::EndMap;
      break;
    case Json::value_t::array:
      if (value.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        break;
      }
      out << YAML::BeginSeq;
      for (const auto& child : value) emitYaml(out, child);
      out << YAML::EndSeq;
      break;
    case Json::value_t::string: {
      const auto& s = value.get_ref<const std::string&>();
      if (needsQuotes(s)) out << YAML::DoubleQuoted;
      out << s;
      break;
    }
    case Json::value_t::null:
      out << YAML::Null;
      break;
    case Json::value_t::boolean:
      out << (value.get<bool>() ? "true" : "false");
      break;
    default:  // numbers: the JSON spelling is valid YAML
      out << value.dump();
      break;
  }
}

// Strings come from the config file and flags as given, and need not be UTF-8: dump()'s
// default would throw on them (and end kproxy at start-up, which serves /configz); replace
// the bad bytes with U+FFFD instead.
std::string dumpJson(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

std::string toJson(const ProxyConfig& config) { return dumpJson(toJsonValue(config)); }

std::string toConfigzJson(const ProxyConfig& config) {
  Json j = Json::object();
  j["kubeproxy.config.k8s.io"] = toJsonValue(config);
  return dumpJson(j);
}

std::string toYaml(const ProxyConfig& config) {
  YAML::Emitter out;
  out.SetIndent(2);
  emitYaml(out, toJsonValue(config));
  std::string text = out.c_str();
  text += '\n';
  return text;
}

core::Result<void> writeConfigFile(const ProxyConfig& config, const std::string& path) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) {
    return makeError(ErrorCategory::kIo, fmt::format("writing config file {}", path), errno);
  }
  file << toYaml(config);
  file.close();
  if (!file) {
    return makeError(ErrorCategory::kIo, fmt::format("writing config file {}", path), errno);
  }
  return {};
}

}  // namespace kproxy::cli
