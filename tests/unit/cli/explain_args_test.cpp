// parseExplainCommand: the packet of `kproxy explain` and the words left for parseFlags().

#include "explain_args.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using kproxy::cli::parseExplainCommand;

namespace {
auto parse(std::vector<const char*> args) { return parseExplainCommand(args); }
}  // namespace

TEST_CASE("explain: an IPv4 packet, flags in any order, kproxy flags kept", "[unit]") {
  auto c = parse({"--manifests", "/m", "10.244.1.5", "--json", "10.96.0.20:80/udp", "--iif",
                  "eth0", "--masquerade-all", "-v", "2"});
  REQUIRE(c);
  CHECK(c->request.sourceIP == "10.244.1.5");
  CHECK(c->request.destinationIP == "10.96.0.20");
  CHECK(c->request.destinationPort == 80);
  CHECK(c->request.protocol == kproxy::core::Protocol::kUDP);
  CHECK(c->request.family == kproxy::net::Family::kIPv4);
  CHECK(c->request.json);
  CHECK_FALSE(c->request.fromNode);
  CHECK(c->request.inputInterface == "eth0");
  std::vector<std::string> flags(c->flags.begin(), c->flags.end());
  CHECK(flags == std::vector<std::string>{"--manifests", "/m", "--masquerade-all", "-v", "2"});
}

TEST_CASE("explain: IPv6 in brackets, tcp by default, --from-node", "[unit]") {
  auto c = parse({"fd00::1", "[fd00:10:96::20]:443", "--from-node"});
  REQUIRE(c);
  CHECK(c->request.destinationIP == "fd00:10:96::20");
  CHECK(c->request.destinationPort == 443);
  CHECK(c->request.protocol == kproxy::core::Protocol::kTCP);
  CHECK(c->request.family == kproxy::net::Family::kIPv6);
  CHECK(c->request.fromNode);
}

TEST_CASE("explain: bad words are one-line errors naming them", "[unit]") {
  auto message = [](std::vector<const char*> args) {
    auto c = parseExplainCommand(args);
    REQUIRE_FALSE(c);
    return c.error().message();
  };
  CHECK_THAT(message({"10.0.0.1"}), Catch::Contains("got 1 arguments"));
  CHECK_THAT(message({"10.0.0.1", "10.96.0.20"}), Catch::Contains("\"10.96.0.20\": no port"));
  CHECK_THAT(message({"10.0.0.1", "10.96.0.20:0"}), Catch::Contains("port must be 1-65535"));
  CHECK_THAT(message({"10.0.0.1", "10.96.0.20:70000"}), Catch::Contains("port must be 1-65535"));
  CHECK_THAT(message({"10.0.0.1", "10.96.0.20:80/icmp"}), Catch::Contains("unknown protocol \"icmp\""));
  CHECK_THAT(message({"nope", "10.96.0.20:80"}), Catch::Contains("bad source \"nope\""));
  CHECK_THAT(message({"10.0.0.1", "fd00::1:80"}), Catch::Contains("in brackets"));
  CHECK_THAT(message({"10.0.0.1", "[fd00::1]:80"}), Catch::Contains("different IP families"));
  CHECK_THAT(message({"10.0.0.1", "10.96.0.20:80", "--from-node", "--iif", "eth0"}),
             Catch::Contains("cannot be given with --from-node"));
  CHECK_THAT(message({"10.0.0.1", "10.96.0.20:80", "--iif"}), Catch::Contains("--iif"));
}
