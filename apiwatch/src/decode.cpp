#include "kproxy/apiwatch/decode.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace kproxy::apiwatch {
namespace {

using nlohmann::json;

// Inside this file a decoding failure unwinds with an exception: it keeps the field-by-field
// code readable. Every public function catches it and returns an Error, so nothing escapes.

/// Where a value sits in the document: a chain of stack-allocated segments, formatted only
/// when an error is reported, so successful decoding builds no strings. JSON keys outlive the
/// chain (string_view); YAML keys are converted copies (std::string).
template <typename Key>
struct BasicLoc {
  const BasicLoc* parent = nullptr;
  Key key;
  std::size_t index = 0;
  bool isIndex = false;

  BasicLoc field(std::string_view k) const { return BasicLoc{this, Key(k), 0, false}; }
  BasicLoc at(std::size_t i) const { return BasicLoc{this, {}, i, true}; }

  std::string str() const {
    std::string out = parent != nullptr ? parent->str() : std::string();
    if (isIndex) {
      out += fmt::format("[{}]", index);
    } else if (!key.empty()) {
      if (!out.empty()) out += '.';
      out += key;
    }
    return out;
  }
};
using Loc = BasicLoc<std::string_view>;

struct DecodeFailure {
  std::string path;
  std::string reason;
};

[[noreturn]] void fail(const Loc& loc, std::string reason) {
  throw DecodeFailure{loc.str(), std::move(reason)};
}

const char* jsonTypeName(const json& value) { return value.type_name(); }

std::string quote(std::string_view s) { return fmt::format("\"{}\"", s); }

/// The member `key` of `obj`, or nullptr when absent or null (Kubernetes treats them alike).
const json* member(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const json& expectObject(const json& value, const Loc& loc) {
  if (!value.is_object()) fail(loc, fmt::format("expected an object, got {}", jsonTypeName(value)));
  return value;
}

const json* objectField(const json& obj, const Loc& objLoc, std::string_view key) {
  const json* v = member(obj, key);
  if (v != nullptr) expectObject(*v, objLoc.field(key));
  return v;
}

const json* arrayField(const json& obj, const Loc& objLoc, std::string_view key) {
  const json* v = member(obj, key);
  if (v != nullptr && !v->is_array())
    fail(objLoc.field(key), fmt::format("expected an array, got {}", jsonTypeName(*v)));
  return v;
}

std::string asString(const json& value, const Loc& loc) {
  if (!value.is_string()) fail(loc, fmt::format("expected a string, got {}", jsonTypeName(value)));
  return value.get<std::string>();
}

std::optional<std::string> optString(const json& obj, const Loc& objLoc, std::string_view key) {
  const json* v = member(obj, key);
  if (v == nullptr) return std::nullopt;
  return asString(*v, objLoc.field(key));
}

std::string stringOr(const json& obj, const Loc& objLoc, std::string_view key,
                     std::string fallback = {}) {
  auto v = optString(obj, objLoc, key);
  return v.has_value() ? std::move(*v) : std::move(fallback);
}

std::int64_t asInteger(const json& value, const Loc& loc) {
  if (value.is_number_integer()) {
    if (value.is_number_unsigned()) {
      auto u = value.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(loc, "integer out of range");
      return static_cast<std::int64_t>(u);
    }
    return value.get<std::int64_t>();
  }
  fail(loc, fmt::format("expected an integer, got {}",
                        value.is_number() ? "a fraction" : jsonTypeName(value)));
}

std::optional<std::int32_t> optInt32(const json& obj, const Loc& objLoc, std::string_view key,
                                     std::int64_t min, std::int64_t max) {
  const json* v = member(obj, key);
  if (v == nullptr) return std::nullopt;
  Loc loc = objLoc.field(key);
  std::int64_t n = asInteger(*v, loc);
  if (n < min || n > max) fail(loc, fmt::format("{} is out of range [{}, {}]", n, min, max));
  return static_cast<std::int32_t>(n);
}

std::optional<bool> optBool(const json& obj, const Loc& objLoc, std::string_view key) {
  const json* v = member(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean())
    fail(objLoc.field(key), fmt::format("expected a boolean, got {}", jsonTypeName(*v)));
  return v->get<bool>();
}

std::vector<std::string> stringList(const json& obj, const Loc& objLoc, std::string_view key) {
  std::vector<std::string> out;
  const json* arr = arrayField(obj, objLoc, key);
  if (arr == nullptr) return out;
  Loc loc = objLoc.field(key);
  out.reserve(arr->size());
  for (std::size_t i = 0; i < arr->size(); ++i) out.push_back(asString((*arr)[i], loc.at(i)));
  return out;
}

core::Labels stringMap(const json& obj, const Loc& objLoc, std::string_view key) {
  core::Labels out;
  const json* m = objectField(obj, objLoc, key);
  if (m == nullptr) return out;
  Loc loc = objLoc.field(key);
  for (const auto& [k, v] : m->items()) {
    // Keys are std::string in nlohmann::json; the Loc only borrows it for this iteration.
    out.emplace(k, asString(v, loc.field(k)));
  }
  return out;
}

/// Maps a string onto an enum via a table of its Kubernetes spellings.
template <typename Enum, std::size_t N>
Enum enumValue(const json& value, const Loc& loc,
               const std::pair<std::string_view, Enum> (&table)[N]) {
  std::string text = asString(value, loc);
  for (const auto& [spelling, e] : table)
    if (spelling == text) return e;
  std::string allowed;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) allowed += i + 1 == N ? " or " : ", ";
    allowed += table[i].first;
  }
  fail(loc, fmt::format("unsupported value {} (want {})", quote(text), allowed));
}

/// An optional enum field; absent, null and "" all mean "not set" (the API's zero value).
template <typename Enum, std::size_t N>
std::optional<Enum> optEnum(const json& obj, const Loc& objLoc, std::string_view key,
                            const std::pair<std::string_view, Enum> (&table)[N]) {
  const json* v = member(obj, key);
  if (v == nullptr || (v->is_string() && v->get_ref<const std::string&>().empty()))
    return std::nullopt;
  return enumValue(*v, objLoc.field(key), table);
}

constexpr std::pair<std::string_view, core::Protocol> kProtocols[] = {
    {"TCP", core::Protocol::kTCP}, {"UDP", core::Protocol::kUDP}, {"SCTP", core::Protocol::kSCTP}};
constexpr std::pair<std::string_view, core::ServiceType> kServiceTypes[] = {
    {"ClusterIP", core::ServiceType::kClusterIP},
    {"NodePort", core::ServiceType::kNodePort},
    {"LoadBalancer", core::ServiceType::kLoadBalancer},
    {"ExternalName", core::ServiceType::kExternalName}};
constexpr std::pair<std::string_view, core::TrafficPolicy> kTrafficPolicies[] = {
    {"Cluster", core::TrafficPolicy::kCluster}, {"Local", core::TrafficPolicy::kLocal}};
constexpr std::pair<std::string_view, core::SessionAffinity> kAffinities[] = {
    {"None", core::SessionAffinity::kNone}, {"ClientIP", core::SessionAffinity::kClientIP}};
constexpr std::pair<std::string_view, core::LoadBalancerIPMode> kIPModes[] = {
    {"VIP", core::LoadBalancerIPMode::kVIP}, {"Proxy", core::LoadBalancerIPMode::kProxy}};
constexpr std::pair<std::string_view, core::AddressType> kAddressTypes[] = {
    {"IPv4", core::AddressType::kIPv4},
    {"IPv6", core::AddressType::kIPv6},
    {"FQDN", core::AddressType::kFQDN}};
constexpr std::pair<std::string_view, net::Family> kIPFamilies[] = {
    {"IPv4", net::Family::kIPv4}, {"IPv6", net::Family::kIPv6}};

constexpr std::int64_t kMaxPort = 65535;
// Upstream validation: ClientIP affinity timeout in (0, 86400].
constexpr std::int64_t kMaxStickyTimeoutSeconds = 86400;

/// The identity read from metadata before anything else, so later errors can name the object.
struct Meta {
  std::string ns;
  std::string name;
  core::Labels labels;
  std::string resourceVersion;
  bool deleting = false;
};

/// Reads `kind` (checked against `expectedKind` when present) and metadata. `label` receives
/// the object's description as soon as the name is known.
Meta decodeMeta(const json& object, std::string_view expectedKind, bool namespaced,
                std::string& label) {
  Loc root;
  expectObject(object, root);
  if (auto kind = optString(object, root, "kind"); kind.has_value() && *kind != expectedKind)
    fail(root.field("kind"), fmt::format("expected {}, got {}", quote(expectedKind), quote(*kind)));
  Meta meta;
  const json* md = objectField(object, root, "metadata");
  Loc mdLoc = root.field("metadata");
  if (md != nullptr) {
    meta.name = stringOr(*md, mdLoc, "name");
    if (namespaced) meta.ns = stringOr(*md, mdLoc, "namespace");
  }
  if (namespaced && meta.ns.empty()) meta.ns = "default";
  if (!meta.name.empty()) {
    label = namespaced ? fmt::format("{} {}/{}", expectedKind, meta.ns, meta.name)
                       : fmt::format("{} {}", expectedKind, meta.name);
  } else if (namespaced) {
    label = fmt::format("{} in namespace {}", expectedKind, meta.ns);
  }
  if (meta.name.empty()) fail(mdLoc.field("name"), "required field is missing or empty");
  meta.labels = stringMap(*md, mdLoc, "labels");
  meta.resourceVersion = stringOr(*md, mdLoc, "resourceVersion");
  // Only presence matters; the timestamp format is the API server's business.
  if (const json* ts = member(*md, "deletionTimestamp"); ts != nullptr) {
    asString(*ts, mdLoc.field("deletionTimestamp"));
    meta.deleting = true;
  }
  return meta;
}

core::ServicePortSpec decodeServicePort(const json& p, const Loc& loc) {
  expectObject(p, loc);
  core::ServicePortSpec port;
  port.name = stringOr(p, loc, "name");
  port.protocol = optEnum(p, loc, "protocol", kProtocols).value_or(core::Protocol::kTCP);
  auto number = optInt32(p, loc, "port", 1, kMaxPort);
  if (!number.has_value()) fail(loc.field("port"), "required field is missing");
  port.port = *number;
  if (const json* tp = member(p, "targetPort"); tp != nullptr) {
    Loc tpLoc = loc.field("targetPort");
    if (tp->is_string()) {
      port.targetPort.name = tp->get<std::string>();
    } else if (tp->is_number()) {
      std::int64_t n = asInteger(*tp, tpLoc);
      if (n < 0 || n > kMaxPort) fail(tpLoc, fmt::format("{} is out of range [1, 65535]", n));
      port.targetPort.number = static_cast<std::int32_t>(n);
    } else {
      fail(tpLoc, fmt::format("expected an integer or a string, got {}", jsonTypeName(*tp)));
    }
  }
  // API defaulting: an unset (0 or "") targetPort means "same as port".
  if (port.targetPort.name.empty() && port.targetPort.number == 0)
    port.targetPort.number = port.port;
  port.nodePort = optInt32(p, loc, "nodePort", 0, kMaxPort).value_or(0);
  port.appProtocol = optString(p, loc, "appProtocol");
  return port;
}

core::LoadBalancerIngress decodeIngress(const json& in, const Loc& loc) {
  expectObject(in, loc);
  core::LoadBalancerIngress ingress;
  ingress.ip = stringOr(in, loc, "ip");
  ingress.hostname = stringOr(in, loc, "hostname");
  ingress.ipMode = optEnum(in, loc, "ipMode", kIPModes);
  return ingress;
}

/// The labels of `labels` named in `wanted`. Services and EndpointSlices are held for as long
/// as they exist, and their other labels (app, chart, managed-by, ...) mean nothing to a proxy.
core::Labels keepLabels(core::Labels labels, std::initializer_list<std::string_view> wanted) {
  std::erase_if(labels, [&](const auto& label) {
    return std::find(wanted.begin(), wanted.end(), label.first) == wanted.end();
  });
  return labels;
}

core::Service decodeServiceBody(const json& object, std::string& label) {
  Meta meta = decodeMeta(object, "Service", true, label);
  core::Service svc;
  svc.ns = std::move(meta.ns);
  svc.name = std::move(meta.name);
  svc.labels = keepLabels(std::move(meta.labels), {core::kLabelServiceProxyName, core::kLabelHeadless});
  svc.resourceVersion = std::move(meta.resourceVersion);

  Loc root;
  if (const json* spec = objectField(object, root, "spec"); spec != nullptr) {
    Loc s = root.field("spec");
    svc.type = optEnum(*spec, s, "type", kServiceTypes).value_or(core::ServiceType::kClusterIP);

    // .spec.clusterIPs is authoritative (dual-stack); .spec.clusterIP is its first entry and
    // is what older manifests set alone. The API server rejects a mismatch, and so do we.
    std::string clusterIP = stringOr(*spec, s, "clusterIP");
    svc.clusterIPs = stringList(*spec, s, "clusterIPs");
    if (svc.clusterIPs.empty()) {
      if (!clusterIP.empty()) svc.clusterIPs.push_back(clusterIP);
    } else if (!clusterIP.empty() && clusterIP != svc.clusterIPs.front()) {
      fail(s.field("clusterIP"), fmt::format("{} does not match spec.clusterIPs[0] {}",
                                             quote(clusterIP), quote(svc.clusterIPs.front())));
    }

    if (const json* fams = arrayField(*spec, s, "ipFamilies"); fams != nullptr) {
      Loc f = s.field("ipFamilies");
      for (std::size_t i = 0; i < fams->size(); ++i) {
        svc.ipFamilies.push_back(enumValue((*fams)[i], f.at(i), kIPFamilies));
      }
    }
    // Hand-written manifests usually omit ipFamilies; the API server would derive them from
    // the cluster IPs, so do the same (IPv6 addresses are the ones with a colon).
    if (svc.ipFamilies.empty()) {
      for (const auto& ip : svc.clusterIPs) {
        if (ip == "None") continue;
        svc.ipFamilies.push_back(ip.find(':') != std::string::npos ? net::Family::kIPv6
                                                                   : net::Family::kIPv4);
      }
    }

    if (const json* ports = arrayField(*spec, s, "ports"); ports != nullptr) {
      Loc pl = s.field("ports");
      svc.ports.reserve(ports->size());
      for (std::size_t i = 0; i < ports->size(); ++i)
        svc.ports.push_back(decodeServicePort((*ports)[i], pl.at(i)));
    }
    svc.externalIPs = stringList(*spec, s, "externalIPs");
    svc.loadBalancerSourceRanges = stringList(*spec, s, "loadBalancerSourceRanges");
    svc.externalTrafficPolicy = optEnum(*spec, s, "externalTrafficPolicy", kTrafficPolicies)
                                    .value_or(core::TrafficPolicy::kCluster);
    svc.internalTrafficPolicy = optEnum(*spec, s, "internalTrafficPolicy", kTrafficPolicies)
                                    .value_or(core::TrafficPolicy::kCluster);
    svc.healthCheckNodePort = optInt32(*spec, s, "healthCheckNodePort", 0, kMaxPort).value_or(0);
    svc.sessionAffinity =
        optEnum(*spec, s, "sessionAffinity", kAffinities).value_or(core::SessionAffinity::kNone);
    if (const json* cfg = objectField(*spec, s, "sessionAffinityConfig"); cfg != nullptr) {
      Loc c = s.field("sessionAffinityConfig");
      if (const json* cip = objectField(*cfg, c, "clientIP"); cip != nullptr) {
        if (auto t =
                optInt32(*cip, c.field("clientIP"), "timeoutSeconds", 1, kMaxStickyTimeoutSeconds);
            t.has_value())
          svc.sessionAffinityTimeoutSeconds = *t;
      }
    }
    svc.trafficDistribution = optString(*spec, s, "trafficDistribution");
    if (svc.trafficDistribution.has_value() && svc.trafficDistribution->empty())
      svc.trafficDistribution.reset();
    svc.externalName = stringOr(*spec, s, "externalName");
  }

  if (const json* status = objectField(object, root, "status"); status != nullptr) {
    Loc st = root.field("status");
    if (const json* lb = objectField(*status, st, "loadBalancer"); lb != nullptr) {
      Loc l = st.field("loadBalancer");
      if (const json* ing = arrayField(*lb, l, "ingress"); ing != nullptr) {
        Loc il = l.field("ingress");
        for (std::size_t i = 0; i < ing->size(); ++i)
          svc.loadBalancerIngress.push_back(decodeIngress((*ing)[i], il.at(i)));
      }
    }
  }
  return svc;
}

std::vector<std::string> hintNames(const json& hints, const Loc& hLoc, std::string_view key) {
  std::vector<std::string> out;
  const json* arr = arrayField(hints, hLoc, key);
  if (arr == nullptr) return out;
  Loc l = hLoc.field(key);
  for (std::size_t i = 0; i < arr->size(); ++i) {
    Loc e = l.at(i);
    expectObject((*arr)[i], e);
    auto name = optString((*arr)[i], e, "name");
    if (!name.has_value() || name->empty())
      fail(e.field("name"), "required field is missing or empty");
    out.push_back(std::move(*name));
  }
  return out;
}

core::SliceEndpoint decodeSliceEndpoint(const json& ep, const Loc& loc) {
  expectObject(ep, loc);
  core::SliceEndpoint out;
  out.addresses = stringList(ep, loc, "addresses");
  if (const json* cond = objectField(ep, loc, "conditions"); cond != nullptr) {
    Loc c = loc.field("conditions");
    out.conditions.ready = optBool(*cond, c, "ready");
    out.conditions.serving = optBool(*cond, c, "serving");
    out.conditions.terminating = optBool(*cond, c, "terminating");
  }
  out.nodeName = optString(ep, loc, "nodeName");
  out.zone = optString(ep, loc, "zone");
  if (const json* hints = objectField(ep, loc, "hints"); hints != nullptr) {
    Loc h = loc.field("hints");
    core::EndpointHints eh;
    eh.forZones = hintNames(*hints, h, "forZones");
    eh.forNodes = hintNames(*hints, h, "forNodes");
    out.hints = std::move(eh);
  }
  return out;
}

core::EndpointPort decodeEndpointPort(const json& p, const Loc& loc) {
  expectObject(p, loc);
  core::EndpointPort out;
  // API defaulting (discovery/v1 SetDefaults_EndpointPort): name "" and protocol TCP.
  out.name = optString(p, loc, "name").value_or("");
  out.protocol = optEnum(p, loc, "protocol", kProtocols).value_or(core::Protocol::kTCP);
  out.port = optInt32(p, loc, "port", 1, kMaxPort);
  out.appProtocol = optString(p, loc, "appProtocol");
  return out;
}

/// Parses RFC 3339 ("2026-11-22T00:40:00Z", fractional seconds and offsets allowed) into
/// wall seconds since the epoch; nullopt when it is not such a time.
std::optional<double> parseRfc3339(const std::string& text) {
  int year, month, day, hour, minute, second, consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute,
                  &second, &consumed) != 6 || consumed != 19)
    return std::nullopt;
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  double seconds = static_cast<double>(timegm(&tm));
  std::size_t i = 19;
  if (i < text.size() && text[i] == '.') {
    double scale = 0.1;
    for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
      seconds += (text[i] - '0') * scale;
      scale /= 10;
    }
  }
  if (i < text.size() && (text[i] == 'Z' || text[i] == 'z') && i + 1 == text.size()) return seconds;
  int offH = 0, offM = 0;
  if (i + 6 == text.size() && (text[i] == '+' || text[i] == '-') &&
      std::sscanf(text.c_str() + i + 1, "%2d:%2d", &offH, &offM) == 2) {
    double offset = offH * 3600.0 + offM * 60.0;
    return text[i] == '+' ? seconds - offset : seconds + offset;
  }
  return std::nullopt;
}

core::EndpointSlice decodeEndpointSliceBody(const json& object, std::string& label) {
  Meta meta = decodeMeta(object, "EndpointSlice", true, label);
  core::EndpointSlice slice;
  slice.ns = std::move(meta.ns);
  slice.name = std::move(meta.name);
  slice.resourceVersion = std::move(meta.resourceVersion);
  if (auto it = meta.labels.find(core::kLabelServiceName); it != meta.labels.end())
    slice.serviceName = it->second;
  // The service's name is kept once, as serviceName.
  slice.labels = keepLabels(std::move(meta.labels), {core::kLabelHeadless});
  // The trigger time only feeds a latency metric: an unreadable one is ignored, not an error.
  if (const json* md = member(object, "metadata"); md != nullptr && md->is_object()) {
    if (const json* ann = member(*md, "annotations"); ann != nullptr && ann->is_object()) {
      if (const json* t = member(*ann, core::kAnnotationLastChangeTriggerTime);
          t != nullptr && t->is_string())
        slice.lastChangeTriggerTime = parseRfc3339(t->get<std::string>());
    }
  }

  Loc root;
  auto addressType = optEnum(object, root, "addressType", kAddressTypes);
  if (!addressType.has_value()) fail(root.field("addressType"), "required field is missing");
  slice.addressType = *addressType;
  if (const json* ports = arrayField(object, root, "ports"); ports != nullptr) {
    Loc pl = root.field("ports");
    for (std::size_t i = 0; i < ports->size(); ++i)
      slice.ports.push_back(decodeEndpointPort((*ports)[i], pl.at(i)));
  }
  if (const json* eps = arrayField(object, root, "endpoints"); eps != nullptr) {
    Loc el = root.field("endpoints");
    slice.endpoints.reserve(eps->size());
    for (std::size_t i = 0; i < eps->size(); ++i)
      slice.endpoints.push_back(decodeSliceEndpoint((*eps)[i], el.at(i)));
  }
  return slice;
}

core::Node decodeNodeBody(const json& object, std::string& label) {
  Meta meta = decodeMeta(object, "Node", false, label);
  core::Node node;
  node.name = std::move(meta.name);
  node.labels = std::move(meta.labels);
  node.resourceVersion = std::move(meta.resourceVersion);
  node.deleting = meta.deleting;

  Loc root;
  if (const json* spec = objectField(object, root, "spec"); spec != nullptr) {
    Loc s = root.field("spec");
    node.podCIDRs = stringList(*spec, s, "podCIDRs");
    // podCIDR is the single-stack predecessor of podCIDRs (and equals podCIDRs[0] when both).
    if (auto one = optString(*spec, s, "podCIDR");
        node.podCIDRs.empty() && one.has_value() && !one->empty())
      node.podCIDRs.push_back(*one);
    // Taints: the health server reads the cluster autoscaler's ToBeDeletedByClusterAutoscaler.
    if (const json* taints = arrayField(*spec, s, "taints"); taints != nullptr) {
      Loc tl = s.field("taints");
      for (std::size_t i = 0; i < taints->size(); ++i) {
        Loc t = tl.at(i);
        expectObject((*taints)[i], t);
        node.taints.push_back(core::Taint{stringOr((*taints)[i], t, "key"),
                                          stringOr((*taints)[i], t, "value"),
                                          stringOr((*taints)[i], t, "effect")});
      }
    }
  }
  if (const json* status = objectField(object, root, "status"); status != nullptr) {
    Loc st = root.field("status");
    if (const json* addrs = arrayField(*status, st, "addresses"); addrs != nullptr) {
      Loc al = st.field("addresses");
      for (std::size_t i = 0; i < addrs->size(); ++i) {
        Loc a = al.at(i);
        expectObject((*addrs)[i], a);
        node.addresses.push_back(core::NodeAddress{stringOr((*addrs)[i], a, "type"),
                                                   stringOr((*addrs)[i], a, "address")});
      }
    }
  }
  return node;
}

core::ServiceCIDR decodeServiceCIDRBody(const json& object, std::string& label) {
  Meta meta = decodeMeta(object, "ServiceCIDR", false, label);
  core::ServiceCIDR out;
  out.name = std::move(meta.name);
  out.resourceVersion = std::move(meta.resourceVersion);
  Loc root;
  if (const json* spec = objectField(object, root, "spec"); spec != nullptr)
    out.cidrs = stringList(*spec, root.field("spec"), "cidrs");
  return out;
}

ApiStatus decodeStatusBody(const json& object) {
  Loc root;
  expectObject(object, root);
  ApiStatus st;
  st.status = stringOr(object, root, "status");
  st.code = optInt32(object, root, "code", std::numeric_limits<std::int32_t>::min(),
                     std::numeric_limits<std::int32_t>::max())
                .value_or(0);
  st.reason = stringOr(object, root, "reason");
  st.message = stringOr(object, root, "message");
  if (const json* details = objectField(object, root, "details"); details != nullptr)
    st.retryAfterSeconds = optInt32(*details, root.field("details"), "retryAfterSeconds", 0,
                                    std::numeric_limits<std::int32_t>::max());
  return st;
}

/// Runs one body decoder and turns a failure into the module's Error.
template <typename Body>
auto guarded(std::string label, Body&& body) -> core::Result<decltype(body(label))> {
  try {
    return body(label);
  } catch (const DecodeFailure& f) {
    std::string where = f.path.empty() ? std::string("(top level)") : f.path;
    std::string context = label.empty() ? fmt::format("{}: {}", where, f.reason)
                                        : fmt::format("{}: {}: {}", label, where, f.reason);
    return core::makeError(core::ErrorCategory::kDecode, std::move(context));
  } catch (const json::exception& e) {
    // Not expected (every access is checked first); keep it an error, never a crash.
    return core::makeError(core::ErrorCategory::kDecode,
                           fmt::format("{}: {}", label.empty() ? "object" : label, e.what()));
  }
}

// ---- YAML → JSON ---------------------------------------------------------------------------

constexpr std::string_view kTagPrefix = "tag:yaml.org,2002:";

using YamlLoc = BasicLoc<std::string>;

[[noreturn]] void yamlFail(const YamlLoc& loc, const YAML::Node& node, std::string reason) {
  const YAML::Mark mark = node.Mark();
  std::string where = loc.str();
  if (where.empty()) where = "(document)";
  if (mark.line >= 0) where += fmt::format(" (line {})", mark.line + 1);
  throw DecodeFailure{std::move(where), std::move(reason)};
}

std::optional<json> parseYamlInteger(std::string_view text) {
  std::string_view digits = text;
  bool negative = false;
  if (!digits.empty() && (digits.front() == '-' || digits.front() == '+')) {
    negative = digits.front() == '-';
    digits.remove_prefix(1);
  }
  int base = 10;
  if (digits.starts_with("0x")) {
    base = 16;
    digits.remove_prefix(2);
  } else if (digits.starts_with("0o")) {
    base = 8;
    digits.remove_prefix(2);
  }
  // Core schema: only decimal integers take a sign.
  if (digits.empty() || (base != 10 && digits.size() + 2 != text.size())) return std::nullopt;
  std::uint64_t magnitude = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, base);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (negative) {
    if (magnitude > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1)
      return std::nullopt;
    return json(static_cast<std::int64_t>(0 - magnitude));
  }
  if (magnitude <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return json(static_cast<std::int64_t>(magnitude));
  return json(magnitude);
}

std::optional<json> parseYamlFloat(std::string_view text) {
  if (text == ".inf" || text == ".Inf" || text == ".INF" || text == "+.inf" || text == "+.Inf" ||
      text == "+.INF" || text == "-.inf" || text == "-.Inf" || text == "-.INF" || text == ".nan" ||
      text == ".NaN" || text == ".NAN")
    return std::nullopt;  // JSON has no representation; treated as a string by the caller
  // YAML 1.2 core float: [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
  std::size_t i = 0;
  if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
  std::size_t intDigits = 0, fracDigits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++intDigits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++fracDigits;
  }
  if (intDigits + fracDigits == 0) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    std::size_t expDigits = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i, ++expDigits;
    if (expDigits == 0) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  std::string copy(text.starts_with('+') ? text.substr(1) : text);
  double value = std::strtod(copy.c_str(), nullptr);
  if (!std::isfinite(value)) return std::nullopt;
  return json(value);
}

bool isYamlNull(std::string_view s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}
std::optional<bool> yamlBool(std::string_view s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

json scalarToJson(const YAML::Node& node, const YamlLoc& loc) {
  const std::string& tag = node.Tag();
  const std::string& text = node.Scalar();
  // "!" marks a quoted or block scalar (non-specific tag): always a string.
  if (tag == "!") return json(text);
  if (tag.empty() || tag == "?") {
    if (isYamlNull(text)) return json(nullptr);
    if (auto b = yamlBool(text)) return json(*b);
    if (auto i = parseYamlInteger(text)) return *i;
    if (auto f = parseYamlFloat(text)) return *f;
    return json(text);
  }
  if (!tag.starts_with(kTagPrefix)) return json(text);  // local tags carry no JSON meaning
  std::string_view type = std::string_view(tag).substr(kTagPrefix.size());
  if (type == "str") return json(text);
  if (type == "null") {
    if (!isYamlNull(text)) yamlFail(loc, node, fmt::format("{} is not a null", quote(text)));
    return json(nullptr);
  }
  if (type == "bool") {
    if (auto b = yamlBool(text)) return json(*b);
    yamlFail(loc, node, fmt::format("{} is not a boolean", quote(text)));
  }
  if (type == "int") {
    if (auto i = parseYamlInteger(text)) return *i;
    yamlFail(loc, node, fmt::format("{} is not an integer", quote(text)));
  }
  if (type == "float") {
    if (auto i = parseYamlInteger(text)) return json(i->get<double>());
    if (auto f = parseYamlFloat(text)) return *f;
    yamlFail(loc, node, fmt::format("{} is not a finite float", quote(text)));
  }
  yamlFail(loc, node, fmt::format("unsupported tag {}", tag));
}

/// Bounds on a YAML document's tree as it is converted: aliases may point at an ancestor (a
/// cycle) or fan out exponentially ("billion laughs"), so both the nesting depth and the number
/// of nodes visited are capped far above any Kubernetes object's.
// Aliases let a few hundred bytes name a billion nodes. Without them a document has fewer
// nodes than bytes, so the budget is a multiple of the document's size (with a floor for
// ordinary anchors in small files): the work is linear in the input, whatever it says.
struct YamlBudget {
  static constexpr std::size_t kMaxDepth = 128;
  static constexpr std::size_t kNodesPerByte = 4;
  static constexpr std::size_t kMinNodes = 10'000;
  std::size_t maxNodes;
  std::size_t nodes = 0;
};

json yamlNodeToJson(const YAML::Node& node, const YamlLoc& loc, YamlBudget& budget, std::size_t depth = 0) {
  if (depth > YamlBudget::kMaxDepth)
    yamlFail(loc, node, fmt::format("nested deeper than {} levels (an alias to an ancestor?)", YamlBudget::kMaxDepth));
  if (++budget.nodes > budget.maxNodes)
    yamlFail(loc, node,
             fmt::format("more than {} nodes, {} per byte of the document (aliases expanding?)",
                         budget.maxNodes, YamlBudget::kNodesPerByte));
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return json(nullptr);
    case YAML::NodeType::Scalar:
      return scalarToJson(node, loc);
    case YAML::NodeType::Sequence: {
      json out = json::array();
      std::size_t i = 0;
      for (const auto& child : node) {
        YamlLoc childLoc{&loc, {}, i++, true};
        out.push_back(yamlNodeToJson(child, childLoc, budget, depth + 1));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) yamlFail(loc, kv.first, "mapping keys must be scalars");
        const std::string& key = kv.first.Scalar();
        YamlLoc childLoc{&loc, key, 0, false};
        if (out.contains(key)) yamlFail(childLoc, kv.first, "duplicate mapping key");
        out[key] = yamlNodeToJson(kv.second, childLoc, budget, depth + 1);
      }
      return out;
    }
  }
  yamlFail(loc, node, "unknown YAML node type");
}

}  // namespace

core::Result<core::Service> decodeService(const nlohmann::json& object) {
  return guarded({}, [&](std::string& label) { return decodeServiceBody(object, label); });
}

core::Result<core::EndpointSlice> decodeEndpointSlice(const nlohmann::json& object) {
  return guarded({}, [&](std::string& label) { return decodeEndpointSliceBody(object, label); });
}

core::Result<core::Node> decodeNode(const nlohmann::json& object) {
  return guarded({}, [&](std::string& label) { return decodeNodeBody(object, label); });
}

core::Result<core::ServiceCIDR> decodeServiceCIDR(const nlohmann::json& object) {
  return guarded({}, [&](std::string& label) { return decodeServiceCIDRBody(object, label); });
}

core::Result<DecodedObject> decodeObject(const nlohmann::json& object) {
  if (!object.is_object())
    return core::makeError(
        core::ErrorCategory::kDecode,
        fmt::format("(top level): expected an object, got {}", object.type_name()));
  const json* kind = member(object, "kind");
  if (kind == nullptr || !kind->is_string() || kind->get_ref<const std::string&>().empty())
    return core::makeError(core::ErrorCategory::kDecode,
                           "kind: required field is missing or not a string");
  const json* apiVersion = member(object, "apiVersion");
  if (apiVersion != nullptr && !apiVersion->is_string())
    return core::makeError(
        core::ErrorCategory::kDecode,
        fmt::format("apiVersion: expected a string, got {}", apiVersion->type_name()));
  const std::string& k = kind->get_ref<const std::string&>();
  const std::string version =
      apiVersion != nullptr ? apiVersion->get<std::string>() : std::string();
  auto lift = [](auto result) -> core::Result<DecodedObject> {
    if (!result) return std::unexpected(std::move(result.error()));
    return DecodedObject(std::move(*result));
  };
  if (k == "Service" && (version.empty() || version == "v1")) return lift(decodeService(object));
  if (k == "EndpointSlice" && (version.empty() || version == "discovery.k8s.io/v1"))
    return lift(decodeEndpointSlice(object));
  if (k == "Node" && (version.empty() || version == "v1")) return lift(decodeNode(object));
  if (k == "ServiceCIDR" && (version.empty() || version == "networking.k8s.io/v1"))
    return lift(decodeServiceCIDR(object));

  UnknownObject unknown{version, k, {}, {}};
  if (const json* md = member(object, "metadata"); md != nullptr && md->is_object()) {
    if (const json* ns = member(*md, "namespace"); ns != nullptr && ns->is_string())
      unknown.ns = ns->get<std::string>();
    if (const json* name = member(*md, "name"); name != nullptr && name->is_string())
      unknown.name = name->get<std::string>();
  }
  return DecodedObject(std::move(unknown));
}

std::string describe(const DecodedObject& object) {
  struct Describer {
    std::string operator()(const core::Service& s) const {
      return fmt::format("Service {}/{}", s.ns, s.name);
    }
    std::string operator()(const core::EndpointSlice& s) const {
      return fmt::format("EndpointSlice {}/{}", s.ns, s.name);
    }
    std::string operator()(const core::Node& n) const { return fmt::format("Node {}", n.name); }
    std::string operator()(const core::ServiceCIDR& c) const {
      return fmt::format("ServiceCIDR {}", c.name);
    }
    std::string operator()(const UnknownObject& u) const {
      std::string kind = u.apiVersion.empty() ? u.kind : fmt::format("{}/{}", u.apiVersion, u.kind);
      if (u.ns.empty()) return fmt::format("{} {}", kind, u.name);
      return fmt::format("{} {}/{}", kind, u.ns, u.name);
    }
  };
  return std::visit(Describer{}, object);
}

core::Result<ApiStatus> decodeStatus(const nlohmann::json& object) {
  return guarded("Status", [&](std::string&) { return decodeStatusBody(object); });
}

const char* toString(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

core::Result<WatchEvent> decodeWatchEvent(nlohmann::json event) {
  return guarded("WatchEvent", [&](std::string&) {
    Loc root;
    expectObject(event, root);
    constexpr std::pair<std::string_view, WatchEventType> kTypes[] = {
        {"ADDED", WatchEventType::kAdded},
        {"MODIFIED", WatchEventType::kModified},
        {"DELETED", WatchEventType::kDeleted},
        {"BOOKMARK", WatchEventType::kBookmark},
        {"ERROR", WatchEventType::kError}};
    WatchEvent out;
    auto type = optEnum(event, root, "type", kTypes);
    if (!type.has_value()) fail(root.field("type"), "required field is missing");
    out.type = *type;
    auto it = event.find("object");
    if (it == event.end() || it->is_null()) fail(root.field("object"), "required field is missing");
    Loc objLoc = root.field("object");
    expectObject(*it, objLoc);
    if (const json* md = objectField(*it, objLoc, "metadata"); md != nullptr)
      out.resourceVersion = stringOr(*md, objLoc.field("metadata"), "resourceVersion");
    if (out.type == WatchEventType::kError) {
      auto status = decodeStatus(*it);
      if (!status) fail(objLoc, status.error().context);
      out.status = std::move(*status);
    }
    out.object = std::move(*it);
    return out;
  });
}

core::Result<nlohmann::json> yamlToJson(const YAML::Node& node, std::size_t sourceBytes) {
  try {
    YamlBudget budget{std::max(YamlBudget::kMinNodes, YamlBudget::kNodesPerByte * sourceBytes)};
    return yamlNodeToJson(node, YamlLoc{}, budget);
  } catch (const DecodeFailure& f) {
    return core::makeError(core::ErrorCategory::kDecode, fmt::format("{}: {}", f.path, f.reason));
  } catch (const YAML::Exception& e) {
    return core::makeError(core::ErrorCategory::kDecode, fmt::format("YAML: {}", e.what()));
  }
}

}  // namespace kproxy::apiwatch
