// renderUserspaceTable: the reasons its drops and rejects carry for the tracer. The reject
// chain is shared by a ClusterIP's other ports and by service ports without endpoints: the
// tags tell them apart, and the kernel's objects stay as they were.
#include "kproxy/userspace/renderer.h"

#include <catch2/catch.hpp>

#include "kproxy/nftables/tracer.h"

using namespace kproxy;
using namespace kproxy::userspace;

namespace {

RedirectEntry entry(const char* address, std::uint16_t port, RedirectAction action) {
  RedirectEntry e;
  e.address = *net::Prefix::parse(address);
  e.port = port;
  e.clusterIP = true;
  e.action = action;
  return e;
}

plan::TraceOutcome outcome(const RenderedTable& table, const char* destination, std::uint16_t port) {
  nftables::GlobalObjects global;
  global.family = net::Family::kIPv4;
  global.sets = table.sets;
  global.chains = table.chains;
  global.elements = table.elements;
  const nftables::NftablesTracer tracer(global, {}, {*net::Prefix::parse("192.168.0.2")});
  auto packet = plan::Packet::make("10.0.0.2", destination, port, "tcp");
  REQUIRE(packet);
  return tracer.trace(*packet).outcome;
}

}  // namespace

TEST_CASE("userspace table: the reject chain's rejects say why, per cause", "[unit]") {
  const RenderedTable table = renderUserspaceTable(
      net::Family::kIPv4,
      {entry("172.30.0.41", 80, RedirectAction{RedirectAction::Kind::kListener, 1}),
       entry("172.30.0.42", 80, RedirectAction{RedirectAction::Kind::kReject, 0})},
      {});
  // A port without endpoints: the services map sends it to the reject chain.
  const plan::TraceOutcome none = outcome(table, "172.30.0.42", 80);
  CHECK(none.verdict == plan::TraceVerdict::kRejected);
  CHECK(none.chain == "reject-chain");
  CHECK(none.reason == plan::DropReason::kNoEndpoints);
  // Another port of a ClusterIP: the same chain, reached by the ClusterIPs' goto.
  const plan::TraceOutcome otherPort = outcome(table, "172.30.0.41", 81);
  CHECK(otherPort.verdict == plan::TraceVerdict::kRejected);
  CHECK(otherPort.chain == "reject-chain");
  CHECK(otherPort.reason == plan::DropReason::kClusterIPPort);
  // The listener's port is not refused.
  CHECK(outcome(table, "172.30.0.41", 80).verdict != plan::TraceVerdict::kRejected);
}
