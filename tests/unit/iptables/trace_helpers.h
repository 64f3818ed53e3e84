#pragma once
/// Helpers of the tests that trace packets through the iptables tracer (the iptables and IPVS
/// modes' tests): a packet, an endpoint list, and whether a path met a rule.

#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/iptables/tracer.h"

namespace kproxy::iptables::testing {

inline Packet packet(const char* src, const char* dst, std::uint16_t port, bool fromNode = false,
                     const char* proto = "tcp") {
  auto p = Packet::make(src, dst, port, proto, fromNode);
  REQUIRE(p);
  return *p;
}

inline std::vector<std::string> eps(std::initializer_list<const char*> list) { return {list.begin(), list.end()}; }

/// Some path of `t` met a rule of `chain` whose text holds `needle`.
inline bool metRule(const Trace& t, std::string_view chain, std::string_view needle) {
  for (const auto& path : t.paths)
    for (const auto& s : path.steps)
      if (s.chain == chain && s.rule.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace kproxy::iptables::testing
