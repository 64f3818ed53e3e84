#pragma once
/// --feature-gates / featureGates against upstream kube-proxy v1.34's known gates: the names,
/// defaults, stages and locks of its DefaultFeatureGate (feature_gates_1_34.inc), checked as
/// upstream's featuregate.SetFromMap checks them.
///
/// What kproxy honours, of the 1.34 gates that change proxying (pkg/proxy reads three):
///  - PreferSameTrafficDistribution (Beta, on): EndpointSlices' node hints; off, they are
///    ignored (core::TrackerConfig::preferSameTrafficDistribution).
///  - LoadBalancerIPMode, MultiCIDRServiceAllocator: GA and locked on, as kproxy always behaves
///    (ipMode Proxy addresses skipped; ServiceCIDRs watched).
/// Not honoured, with a warning when enabled: ComponentFlagz and ComponentStatusz (upstream's
/// alpha /flagz and /statusz pages). LoggingAlphaOptions gates the --log-*-split-stream and
/// --log-*-info-buffer-size options, as upstream's validation does. Every other gate is accepted
/// with no effect, as upstream kube-proxy reads none of them.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kproxy::cli {

enum class FeatureStage { kPreAlpha, kAlpha, kBeta, kGA, kDeprecated };

struct FeatureGateSpec {
  std::string_view name;
  bool defaultValue;
  FeatureStage stage;
  bool lockedToDefault;
};

/// The known gate `name`, or nullptr.
const FeatureGateSpec* findFeatureGate(std::string_view name);

/// How many gates upstream 1.34 knows (for tests).
std::size_t knownFeatureGateCount();

/// Upstream's errors for `gates`, one line each: the first unknown name ends the check
/// (`unrecognized feature gate: Foo`, as upstream returns early), then every gate set against
/// its lock (`cannot set feature gate X to false, feature is locked to true`) or PreAlpha at 1.34.
std::vector<std::string> featureGateErrors(const std::map<std::string, bool>& gates);

/// Upstream's warnings for setting a Deprecated or GA gate (`Setting GA feature gate X=true. It
/// will be removed in a future release.`), and kproxy's for an enabled gate it does not honour.
std::vector<std::string> featureGateWarnings(const std::map<std::string, bool>& gates);

/// Whether `name` is on: set explicitly, else by AllAlpha / AllBeta for a gate of that stage,
/// else its default. Unknown names are off.
bool featureEnabled(const std::map<std::string, bool>& gates, std::string_view name);

}  // namespace kproxy::cli
