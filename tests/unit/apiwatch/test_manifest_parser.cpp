// The manifest parser's JSON List handling: items decoded while the text is parsed must read
// exactly as items decoded from the whole document, whatever the order of the List's keys.
#include "manifest_parser.h"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

using kproxy::apiwatch::DecodedObject;
using kproxy::apiwatch::ManifestEntry;
using kproxy::apiwatch::ManifestFormat;
using kproxy::apiwatch::parseManifest;
namespace core = kproxy::core;

namespace {

const std::string kFullService =
    R"({"kind":"Service","apiVersion":"v1","metadata":{"name":"full","namespace":"a"},)"
    R"("spec":{"clusterIP":"10.96.0.1","ports":[{"port":80}]}})";
const std::string kBareService =
    R"({"metadata":{"name":"bare","namespace":"a"},"spec":{"clusterIP":"10.96.0.2","ports":[{"port":81}]}})";

/// One line per entry: "<item> <what>", where what is the object or the error.
std::vector<std::string> summary(const std::vector<ManifestEntry>& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) {
    std::string line = e.item ? std::to_string(*e.item) : std::string("-");
    line += " ";
    line +=
        e.object ? kproxy::apiwatch::describe(*e.object) : "error: " + e.object.error().message();
    out.push_back(line);
  }
  return out;
}

std::vector<std::string> parseJson(const std::string& text) {
  return summary(parseManifest(text, ManifestFormat::kJson));
}

}  // namespace

TEST_CASE("manifest parser: a List's items, whichever order its keys come in", "[unit]") {
  const std::vector<std::string> want = {"0 Service a/full",
                                         "1 error: kind: required field is missing or not a string",
                                         "2 error: (top level): expected an object, got number"};
  // kubectl writes keys in name order: the kind comes after the items.
  CHECK(parseJson(R"({"apiVersion":"v1","items":[)" + kFullService + "," + kBareService +
                  R"(,5],"kind":"List","metadata":{}})") == want);
  CHECK(parseJson(R"({"kind":"List","apiVersion":"v1","items":[)" + kFullService + "," +
                  kBareService + ",5]}") == want);

  auto entries =
      parseManifest(R"({"kind":"List","items":[)" + kFullService + "]}", ManifestFormat::kJson);
  REQUIRE(entries.size() == 1);
  REQUIRE(entries[0].object.has_value());
  const auto& service = std::get<core::Service>(*entries[0].object);
  CHECK(service.clusterIPs == std::vector<std::string>{"10.96.0.1"});
  REQUIRE(service.ports.size() == 1);
  CHECK(service.ports[0].port == 80);
}

TEST_CASE("manifest parser: typed List items take the List's kind and apiVersion", "[unit]") {
  const std::vector<std::string> want = {"0 Service a/full", "1 Service a/bare"};
  CHECK(parseJson(R"({"apiVersion":"v1","items":[)" + kFullService + "," + kBareService +
                  R"(],"kind":"ServiceList"})") == want);
  CHECK(parseJson(R"({"kind":"ServiceList","items":[)" + kFullService + "," + kBareService +
                  R"(],"apiVersion":"v1"})") == want);
}

TEST_CASE("manifest parser: a document with items that is not a List is one object", "[unit]") {
  // Known to be no List before its items, and found out only after them.
  CHECK(parseJson(R"({"kind":"Widget","apiVersion":"x/v1","metadata":{"name":"w"},"items":[)" +
                  kFullService + "]}") == std::vector<std::string>{"- x/v1/Widget w"});
  CHECK(parseJson(R"({"apiVersion":"x/v1","items":[)" + kFullService +
                  R"(],"kind":"Widget","metadata":{"name":"w"}})") ==
        std::vector<std::string>{"- x/v1/Widget w"});
  CHECK(parseJson(R"({"items":[)" + kFullService + R"(],"kind":7})") ==
        std::vector<std::string>{"- error: kind: required field is missing or not a string"});
  // A later "kind" replaces an earlier one, as JSON objects do.
  CHECK(parseJson(R"({"kind":"List","items":[)" + kFullService +
                  R"(],"kind":"Widget","metadata":{"name":"w"}})") ==
        std::vector<std::string>{"- Widget w"});
}

TEST_CASE("manifest parser: a List's last items array wins, and broken JSON yields no item",
          "[unit]") {
  CHECK(parseJson(R"({"kind":"List","items":[)" + kFullService + R"(],"items":[)" + kBareService +
                  "]}") ==
        std::vector<std::string>{"0 error: kind: required field is missing or not a string"});
  auto broken = parseJson(R"({"kind":"List","items":[)" + kFullService + "," + kBareService);
  REQUIRE(broken.size() == 1);
  CHECK(broken[0].starts_with("- error: JSON syntax error"));
}

TEST_CASE("manifest parser: YAML aliases that loop or fan out are errors, not a crash", "[unit]") {
  // An alias to an ancestor makes the tree infinite; the fuzzer found one that overflowed the
  // stack.
  auto cycle = summary(parseManifest("kind: Service\nspec: &a\n  ports: *a\n", ManifestFormat::kYaml));
  REQUIRE(cycle.size() == 1);
  CHECK(cycle[0].find("error:") != std::string::npos);
  CHECK(cycle[0].find("nested deeper than 128 levels") != std::string::npos);

  // Ten aliases of ten aliases ... (10^9 leaves) stop at the node budget, 4 nodes a byte of
  // the document with a floor of 10,000: this one is 460 bytes.
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  std::string previous = "a";
  for (std::string name : {"b", "c", "d", "e", "f", "g", "h", "i", "j"}) {
    laughs += name + ": &" + name + " [";
    for (int i = 0; i < 10; ++i) laughs += (i ? ", *" : "*") + previous;
    laughs += "]\n";
    previous = name;
  }
  auto fanOut = summary(parseManifest(laughs, ManifestFormat::kYaml));
  REQUIRE(fanOut.size() == 1);
  CHECK(fanOut[0].find("more than 10000 nodes, 4 per byte") != std::string::npos);

  // The budget grows with the document: a 100,000-node document without aliases is read.
  std::string big = "kind: Service\napiVersion: v1\nmetadata: {name: big, namespace: a}\n"
                    "spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\nbulk:\n";
  for (int i = 0; i < 50'000; ++i) big += "- x\n";
  auto large = summary(parseManifest(big, ManifestFormat::kYaml));
  REQUIRE(large.size() == 1);
  CHECK(large[0].find("error") == std::string::npos);

  // An ordinary alias still works.
  auto ok = summary(parseManifest("kind: Service\napiVersion: v1\nmetadata: {name: s, namespace: a}\n"
                                  "spec: {clusterIP: 10.96.0.1, ports: [&p {port: 80}]}\n",
                                  ManifestFormat::kYaml));
  REQUIRE(ok.size() == 1);
  CHECK(ok[0].find("error") == std::string::npos);
}
