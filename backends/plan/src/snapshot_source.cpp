#include "kproxy/plan/snapshot_source.h"

namespace kproxy::plan {

std::optional<sdk::ServicePort> VectorSnapshot::find(net::Family family, const std::string& key) const {
  auto id = [](net::Family f, const std::string& k) { return (f == net::Family::kIPv4 ? "4" : "6") + k; };
  auto lookup = [&]() -> const sdk::ServicePort* {
    auto it = index_.find(id(family, key));
    if (it == index_.end() || it->second >= ports_.size()) return nullptr;
    const auto& p = ports_[it->second];
    return p.family == family && p.key == key ? &p : nullptr;
  };
  const sdk::ServicePort* found = index_.size() == ports_.size() ? lookup() : nullptr;
  if (found == nullptr) {
    // The vector may have changed under the index (a port replaced by another keeps the
    // size): rebuild it before saying the port is not there.
    index_.clear();
    for (std::size_t i = 0; i < ports_.size(); ++i) index_.emplace(id(ports_[i].family, ports_[i].key), i);
    found = lookup();
  }
  if (found == nullptr) return std::nullopt;
  return *found;
}

}  // namespace kproxy::plan
