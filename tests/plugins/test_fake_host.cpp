// The SDK's fake host (kproxy/plugin/testing.h) driving the recorder plugin, compiled into this
// test: what a plugin author's unit test does, under the project's warnings.
#include "kproxy/plugin/testing.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

namespace net = kproxy::net;

extern "C" const kproxy_plugin_descriptor* kproxy_plugin_entry(void);

namespace sdk = kproxy::sdk;
namespace kt = kproxy::sdk::testing;

namespace {

struct RecordFile {
  RecordFile() {
    char name[] = "/tmp/kproxy-fake-host-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path = name;
  }
  ~RecordFile() { unlink(path.c_str()); }
  std::string text() const {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string path;
};

sdk::ServicePort port(const std::string& endpointIP) {
  sdk::ServicePort p;
  p.key = "ns/svc:http";
  p.ns = "ns";
  p.serviceName = "svc";
  p.portName = "http";
  p.clusterIP = "10.96.0.1";
  p.port = 80;
  p.nodePort = 30080;
  p.type = sdk::ServiceType::kNodePort;
  p.hasAnyEndpoints = true;
  sdk::Endpoint e{endpointIP, 8080, true, true, true, false, "n1", "z1"};
  p.clusterEndpoints = {e};
  p.allEndpoints = {e};
  return p;
}

sdk::NodeInfo node() {
  sdk::NodeInfo n{"n1", "z1", {"192.168.0.1"}, {"10.0.0.0/24"}, {}};
  n.nodePortAddresses = sdk::NodePortAddresses{true, {"192.168.0.1"}, false, true};
  return n;
}

}  // namespace

TEST_CASE("fake host: syncs reach the plugin as kproxy sends them", "[unit][fake_host]") {
  RecordFile record;
  kt::FakeHost host;
  kt::PluginUnderTest plugin(kproxy_plugin_entry(), host, {{"record-file", record.path}});
  REQUIRE_FALSE(plugin.createError());

  kt::FakeSnapshot first(node(), {port("10.0.0.5")}, {{"kubernetes", "10.96.0.0/12"}});
  auto out = plugin.sync(nullptr, first, {{net::Family::kIPv4, "ns/svc:http"}}, true);
  REQUIRE(out.has_value());
  CHECK(out->operations == 1);
  CHECK(out->summary == "recorded 1");

  kt::FakeSnapshot second(node(), {});
  REQUIRE(plugin.sync(&first, second, {{net::Family::kIPv4, "ns/svc:http"}}).has_value());

  const std::string text = record.text();
  CHECK_THAT(text, Catch::Contains("option record-file=" + record.path));
  CHECK_THAT(text, Catch::Contains("sync full=1 previous=0 size=1 node=n1\n"));
  CHECK_THAT(text, Catch::Contains("nodeports all4=0 all6=1 addresses=192.168.0.1\n"));
  CHECK_THAT(text, Catch::Contains("changed v4:ns/svc:http v4:ns/svc:http tcp 10.96.0.1:80 "
                                   "nodePort=30080 endpoints=10.0.0.5:8080\n"));
  CHECK_THAT(text, Catch::Contains("sync full=0 previous=1 size=0 node=n1\n"));
  CHECK_THAT(text, Catch::EndsWith("changed v4:ns/svc:http deleted\n"));
  CHECK(host.metric("recorder_syncs_total", {"full"}) == 1.0);
  CHECK(host.metric("recorder_syncs_total", {"partial"}) == 1.0);
  CHECK_FALSE(host.metric("recorder_syncs_total", {"other"}).has_value());
  REQUIRE(host.logs().size() == 2);
  CHECK(host.logs()[0].level == 2);
  CHECK(host.logs()[0].message == "recorder synced");

  REQUIRE(plugin.cleanup().has_value());
  CHECK(record.text().ends_with("cleanup\n"));
}

TEST_CASE("fake host: errors, refusals and explain cross the ABI", "[unit][fake_host]") {
  RecordFile record;
  kt::FakeHost host;
  {
    kt::PluginUnderTest missing(kproxy_plugin_entry(), host);
    REQUIRE(missing.createError());
    CHECK(missing.createError()->message == "recorder: option record-file is required");
    CHECK_FALSE(missing.sync(nullptr, kt::FakeSnapshot(node(), {}), {}).has_value());
  }
  {
    kt::PluginUnderTest unnamed(kproxy_plugin_entry(), host,
                                {{"record-file", record.path}, {"metric-name", ""}});
    REQUIRE(unnamed.createError());
    CHECK(unnamed.createError()->errnum == EINVAL);
    CHECK(unnamed.createError()->category == sdk::ErrorCategory::kInvalidInput);
  }
  kt::PluginUnderTest failing(kproxy_plugin_entry(), host,
                              {{"record-file", record.path}, {"fail-sync", "transient"}});
  auto out = failing.sync(nullptr, kt::FakeSnapshot(node(), {}), {}, true);
  REQUIRE_FALSE(out.has_value());
  CHECK(out.error().category == sdk::ErrorCategory::kTransient);
  CHECK(out.error().errnum == 5);

  sdk::ExplainRequest request;
  request.sourceIP = "10.0.0.9";
  request.destinationIP = "10.96.0.1";
  request.destinationPort = 80;
  request.json = true;
  auto text = failing.explain(kt::FakeSnapshot(node(), {port("10.0.0.5")}), request);
  REQUIRE(text.has_value());
  CHECK_THAT(*text, Catch::StartsWith("json v4 10.0.0.9 -> 10.96.0.1:80/tcp fromNode=0 iif= node=n1\n"));
  CHECK_THAT(*text, Catch::Contains("port v4:ns/svc:http"));
  request.destinationPort = 0;
  auto refused = failing.explain(kt::FakeSnapshot(node(), {}), request);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().errnum == 22);
}
