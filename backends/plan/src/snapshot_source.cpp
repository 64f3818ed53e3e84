#include "kproxy/plan/snapshot_source.h"

namespace kproxy::plan {

std::optional<sdk::ServicePort> VectorSnapshot::find(sdk::Family family, const std::string& key) const {
  auto id = [](sdk::Family f, const std::string& k) { return (f == sdk::Family::kIPv4 ? "4" : "6") + k; };
  if (index_.size() != ports_.size()) {
    index_.clear();
    for (std::size_t i = 0; i < ports_.size(); ++i) index_.emplace(id(ports_[i].family, ports_[i].key), i);
  }
  auto it = index_.find(id(family, key));
  if (it == index_.end() || it->second >= ports_.size()) return std::nullopt;
  const auto& p = ports_[it->second];
  if (p.family != family || p.key != key) return std::nullopt;  // the vector changed under us
  return p;
}

}  // namespace kproxy::plan
