#pragma once
/// Decoders from Kubernetes API JSON (and YAML, through yamlToJson) to kproxy's plain value
/// types. Shared by the API-server client and the manifest-directory source.
///
/// Rules, for every decoder:
///  - Fields kproxy does not use are ignored; a JSON `null` is treated as an absent field.
///    That includes labels: a Service keeps only service.kubernetes.io/service-proxy-name and
///    service.kubernetes.io/headless, an EndpointSlice only the headless one (its
///    kubernetes.io/service-name is its serviceName); a Node keeps all of them. Every label
///    must still be a string.
///  - API-server defaulting is applied for omitted fields (namespace "default", type ClusterIP,
///    protocol TCP, targetPort = port, sessionAffinity None with a 10800 s timeout, ...), so an
///    object read from a hand-written manifest means what it would mean after `kubectl apply`.
///  - A field of the wrong JSON type, a missing metadata.name, an enum value Kubernetes does not
///    define (protocol, type, traffic policy, ...) or a port number out of range is an Error of
///    category kDecode whose context names the object ("Service default/web" when known) and
///    the JSON path of the offending field ("spec.ports[1].protocol").
///  - Address strings are not parsed here: that is the resolver's business.
/// All functions are pure and thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "kproxy/core/error.h"
#include "kproxy/core/model.h"

namespace YAML {
class Node;
}

namespace kproxy::apiwatch {

/// Decodes a core/v1 Service. `kind`, when present, must be "Service" (list items from the API
/// server carry no kind, so its absence is fine).
core::Result<core::Service> decodeService(const nlohmann::json& object);

/// Decodes a discovery.k8s.io/v1 EndpointSlice. `addressType` is required.
core::Result<core::EndpointSlice> decodeEndpointSlice(const nlohmann::json& object);

/// Decodes a core/v1 Node (cluster-scoped: no namespace).
core::Result<core::Node> decodeNode(const nlohmann::json& object);

/// Decodes a networking.k8s.io/v1 ServiceCIDR (cluster-scoped). The CIDR strings are kept as
/// given; the tracker checks them.
core::Result<core::ServiceCIDR> decodeServiceCIDR(const nlohmann::json& object);

/// An object of a kind (or apiVersion) kproxy does not consume. Not an error: manifest
/// directories and lists routinely hold Deployments, ConfigMaps, ...
struct UnknownObject {
  std::string apiVersion;
  std::string kind;
  std::string ns;  ///< empty when absent
  std::string name;
  bool operator==(const UnknownObject&) const = default;
};

using DecodedObject =
    std::variant<core::Service, core::EndpointSlice, core::Node, core::ServiceCIDR, UnknownObject>;

/// Dispatches on `apiVersion`/`kind`: Service (v1), EndpointSlice (discovery.k8s.io/v1), Node
/// (v1) and ServiceCIDR (networking.k8s.io/v1) are decoded; anything else, including other
/// versions of those kinds, is an UnknownObject. A missing apiVersion is accepted for the four
/// known kinds. A missing or
/// non-string `kind` is an error.
core::Result<DecodedObject> decodeObject(const nlohmann::json& object);

/// Human-readable identity for log lines and errors: "Service default/web", "Node n1".
std::string describe(const DecodedObject& object);

/// A meta/v1 Status, as returned with failed requests and in watch ERROR events.
struct ApiStatus {
  std::string status;     ///< "Success" or "Failure"
  std::int32_t code = 0;  ///< HTTP status code, e.g. 410 for an expired resourceVersion
  std::string reason;     ///< machine-readable, e.g. "Expired", "Gone", "NotFound"
  std::string message;    ///< human-readable
  std::optional<std::int32_t> retryAfterSeconds;  ///< details.retryAfterSeconds
  bool operator==(const ApiStatus&) const = default;
};

/// Decodes a meta/v1 Status. Every field is optional in the API; wrong types are errors.
core::Result<ApiStatus> decodeStatus(const nlohmann::json& object);

enum class WatchEventType : std::uint8_t { kAdded, kModified, kDeleted, kBookmark, kError };

const char* toString(WatchEventType type);

/// One line of a watch stream. The object is kept as JSON because the watcher knows which
/// resource it watches and picks the decoder (decodeService, ...) itself.
struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  nlohmann::json object;            ///< the raw object (a Status for kError)
  std::string resourceVersion;      ///< object.metadata.resourceVersion, empty when absent
  std::optional<ApiStatus> status;  ///< set for kError only
};

/// Decodes a watch event: `type` must be ADDED, MODIFIED, DELETED, BOOKMARK or ERROR and
/// `object` must be a JSON object. Pass an rvalue to avoid copying the object.
core::Result<WatchEvent> decodeWatchEvent(nlohmann::json event);

/// Converts one YAML document to JSON following the YAML 1.2 core schema, as Kubernetes users
/// expect: a plain (unquoted) 80 is a number, a quoted "80" stays a string, true/false are
/// booleans, null/~/empty are null; explicit tags (!!str, !!int, ...) are honoured. Mapping
/// keys must be scalars. Errors name the path of the offending node. `sourceBytes`, the size of
/// the document's text, bounds the nodes that aliases may expand to (4 per byte, at least
/// 10,000), so that the work stays linear in the input.
core::Result<nlohmann::json> yamlToJson(const YAML::Node& node, std::size_t sourceBytes);

}  // namespace kproxy::apiwatch
