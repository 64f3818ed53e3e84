#pragma once
// What every successfully decoded object must satisfy, whatever the input.

#include <variant>

#include "fuzz_check.h"
#include "kproxy/apiwatch/decode.h"

namespace kproxy::fuzz {

inline void checkDecoded(const core::Service& s) {
  KPROXY_FUZZ_CHECK(!s.name.empty(), "a decoded Service has a name");
  KPROXY_FUZZ_CHECK(!s.ns.empty(), "a decoded Service has a namespace (defaulted)");
}
inline void checkDecoded(const core::EndpointSlice& e) {
  KPROXY_FUZZ_CHECK(!e.name.empty(), "a decoded EndpointSlice has a name");
  KPROXY_FUZZ_CHECK(!e.ns.empty(), "a decoded EndpointSlice has a namespace (defaulted)");
}
inline void checkDecoded(const core::Node& n) {
  KPROXY_FUZZ_CHECK(!n.name.empty(), "a decoded Node has a name");
}
inline void checkDecoded(const apiwatch::UnknownObject& o) {
  KPROXY_FUZZ_CHECK(!o.kind.empty(), "an unknown object has a kind");
}
inline void checkDecoded(const apiwatch::DecodedObject& object) {
  std::visit([](const auto& o) { checkDecoded(o); }, object);
  KPROXY_FUZZ_CHECK(!apiwatch::describe(object).empty(), "a decoded object can be described");
}

}  // namespace kproxy::fuzz
