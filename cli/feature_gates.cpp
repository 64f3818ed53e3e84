#include "feature_gates.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace kproxy::cli {
namespace {

constexpr FeatureGateSpec kGates[] = {
#include "feature_gates_1_34.inc"
};

// Enabled gates kproxy has no behaviour for, though upstream kube-proxy acts on them.
constexpr std::string_view kNotHonoured[] = {"ComponentFlagz", "ComponentStatusz"};

}  // namespace

const FeatureGateSpec* findFeatureGate(std::string_view name) {
  // The table is sorted by name (byte order).
  const auto it = std::lower_bound(std::begin(kGates), std::end(kGates), name,
                                   [](const FeatureGateSpec& g, std::string_view n) { return g.name < n; });
  return it != std::end(kGates) && it->name == name ? &*it : nullptr;
}

std::size_t knownFeatureGateCount() { return std::size(kGates); }

std::vector<std::string> featureGateErrors(const std::map<std::string, bool>& gates) {
  std::vector<std::string> errors;
  for (const auto& [name, value] : gates) {
    const FeatureGateSpec* spec = findFeatureGate(name);
    if (spec == nullptr) return {fmt::format("unrecognized feature gate: {}", name)};
    if (spec->lockedToDefault && spec->defaultValue != value) {
      errors.push_back(fmt::format("cannot set feature gate {} to {}, feature is locked to {}", name, value,
                                   spec->defaultValue));
    } else if (spec->stage == FeatureStage::kPreAlpha) {
      errors.push_back(
          fmt::format("cannot set feature gate {} to {}, feature is PreAlpha at emulated version 1.34", name, value));
    }
  }
  return errors;
}

std::vector<std::string> featureGateWarnings(const std::map<std::string, bool>& gates) {
  std::vector<std::string> warnings;
  for (const auto& [name, value] : gates) {
    const FeatureGateSpec* spec = findFeatureGate(name);
    if (spec == nullptr) continue;
    if (spec->stage == FeatureStage::kDeprecated) {
      warnings.push_back(fmt::format("Setting deprecated feature gate {}={}. It will be removed in a future release.",
                                     name, value));
    } else if (spec->stage == FeatureStage::kGA) {
      warnings.push_back(
          fmt::format("Setting GA feature gate {}={}. It will be removed in a future release.", name, value));
    }
  }
  for (std::string_view name : kNotHonoured) {
    if (featureEnabled(gates, name))
      warnings.push_back(fmt::format("feature gate {} is enabled but kproxy does not implement it; ignored", name));
  }
  return warnings;
}

bool featureEnabled(const std::map<std::string, bool>& gates, std::string_view name) {
  const FeatureGateSpec* spec = findFeatureGate(name);
  if (spec == nullptr) return false;
  if (auto it = gates.find(std::string(name)); it != gates.end()) return it->second;
  const char* all = spec->stage == FeatureStage::kAlpha ? "AllAlpha" : spec->stage == FeatureStage::kBeta ? "AllBeta" : nullptr;
  if (all != nullptr && !spec->lockedToDefault) {
    if (auto it = gates.find(all); it != gates.end()) return it->second;
  }
  return spec->defaultValue;
}

}  // namespace kproxy::cli
