// Unit test of the json backend against the SDK's fake host (kproxy/plugin/testing.h): the
// plugin is driven through its C descriptor as kproxy drives it, with hand-made snapshots, and
// the file it writes is read back. No kproxy process, no root. Exits non-zero on a failure.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <kproxy/plugin/testing.h>

extern "C" const kproxy_plugin_descriptor* kproxy_plugin_entry(void);

namespace {

namespace sdk = kproxy::sdk;
namespace kt = kproxy::sdk::testing;

int failures = 0;
void check(bool ok, const std::string& what) {
  std::cout << (ok ? "PASS " : "FAIL ") << what << "\n";
  if (!ok) ++failures;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

sdk::ServicePort webPort(int endpointCount) {
  sdk::ServicePort p;
  p.key = "demo/web:http";
  p.ns = "demo";
  p.serviceName = "web";
  p.portName = "http";
  p.clusterIP = "10.96.0.10";
  p.port = 80;
  p.hasAnyEndpoints = endpointCount > 0;
  for (int i = 1; i <= endpointCount; ++i) {
    sdk::Endpoint e{"10.244.1." + std::to_string(10 + i), 8080, true, true, true, false, "n1", ""};
    p.clusterEndpoints.push_back(e);
    p.allEndpoints.push_back(e);
  }
  return p;
}

}  // namespace

int main() {
  char dir[] = "/tmp/kproxy-json-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 2;
  const std::string file = std::string(dir) + "/state.json";
  kt::FakeHost host;
  sdk::NodeInfo node{"n1", "", {"192.168.50.1"}, {"10.244.1.0/24"}, {}};

  {
    kt::PluginUnderTest refused(kproxy_plugin_entry(), host, {{"dry-run", "false"}});
    check(refused.createError() &&
              refused.createError()->category == sdk::ErrorCategory::kInvalidInput,
          "create without an output file is refused as invalid input");
  }

  kt::PluginUnderTest plugin(kproxy_plugin_entry(), host,
                             {{"json-file", file}, {"dry-run", "false"}});
  check(!plugin.createError(), "create with json-file");

  kt::FakeSnapshot first(node, {webPort(3)}, {{"kubernetes", "10.96.0.0/12"}});
  auto out = plugin.sync(nullptr, first, {{sdk::Family::kIPv4, "demo/web:http"}}, true);
  check(out.has_value() && out->operations == 1, "full sync writes one service port");
  std::string json = slurp(file);
  check(json.find(R"("key":"demo/web:http")") != std::string::npos,
        "the file names the service port");
  check(json.find(R"("ip":"10.244.1.13")") != std::string::npos,
        "the file lists the third endpoint");
  check(json.find(R"({"name":"kubernetes","cidr":"10.96.0.0/12"})") != std::string::npos,
        "the file lists the ServiceCIDR");
  check(host.metric("kproxy_json_service_ports") == 1.0, "gauge kproxy_json_service_ports is 1");
  // A self-verification: the same snapshot again in full. Nothing differs: 0 operations; a
  // file changed behind the backend's back: one rewrite, and the file is back.
  out = plugin.sync(&first, first, {}, true);
  check(out.has_value() && out->operations == 0, "a full sync of what is written changes nothing");
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    if (f != nullptr) std::fclose(f);
  }
  out = plugin.sync(&first, first, {}, true);
  check(out.has_value() && out->operations == 1 && slurp(file) == json,
        "a full sync rewrites a file emptied behind its back");

  kt::FakeSnapshot second(node, {webPort(1)});
  out = plugin.sync(&first, second, {{sdk::Family::kIPv4, "demo/web:http"}});
  json = slurp(file);
  check(out.has_value() && json.find("10.244.1.13") == std::string::npos &&
            json.find("10.244.1.11") != std::string::npos,
        "a partial sync rewrites the changed port");

  kt::FakeSnapshot third(node, {});
  out = plugin.sync(&second, third, {{sdk::Family::kIPv4, "demo/web:http"}});
  json = slurp(file);
  check(out.has_value() && json.find("demo/web") == std::string::npos,
        "a removed port leaves the file");
  check(host.metric("kproxy_json_writes_total") == 5.0,
        "counter kproxy_json_writes_total counts 5 writes");

  sdk::ExplainRequest request;
  request.destinationIP = "10.96.0.10";
  request.destinationPort = 80;
  auto text = plugin.explain(first, request);
  check(text.has_value() && text->find("10.244.1.12:8080") != std::string::npos,
        "explain names the endpoints of the service port hit");

  // A sync that cannot write fails and says why; the host would retry it as a full sync.
  kt::PluginUnderTest broken(kproxy_plugin_entry(), host,
                             {{"json-file", std::string(dir) + "/missing/state.json"}});
  out = broken.sync(nullptr, first, {}, true);
  check(!out.has_value() && out.error().message.find("missing/state.json.tmp") != std::string::npos,
        "a write failure is an error naming the file");

  check(plugin.cleanup().has_value() && access(file.c_str(), F_OK) != 0,
        "cleanup removes the file");
  check(plugin.cleanup().has_value(), "cleanup twice is fine");
  rmdir(dir);
  std::cout << (failures == 0 ? "all passed" : std::to_string(failures) + " failed") << "\n";
  return failures == 0 ? 0 : 1;
}
