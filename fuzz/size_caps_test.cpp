// Inputs at kproxy's size caps, generated here rather than kept in the tree: a manifest file
// of exactly 64 MiB (the cap of the manifest source) is read, one a byte larger is refused
// without losing the other files; a Service and an EndpointSlice as large as one watch event
// may be (64 MiB) go through the watch-stream framing and the decoders in bounded time.
#include <sys/resource.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kproxy/apiwatch/decode.h"
#include "kproxy/apiwatch/manifest_source.h"
#include "kproxy/core/events.h"
#include "watch_stream.h"

namespace fs = std::filesystem;
namespace core = kproxy::core;
namespace apiwatch = kproxy::apiwatch;
using nlohmann::json;

namespace {

constexpr std::size_t kManifestCap = 64u << 20;  // ManifestSource's kMaxFileBytes
constexpr std::size_t kEventCap = 64u << 20;     // ApiSource's kMaxEventLine

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Under sanitizers (Debug, -O0, shadow memory) reading 64 MiB of JSON takes minutes, even of
// whitespace: the ASan build checks the refusals above the caps and leaves the inputs at the
// caps to the other builds. A Service's ports are cut to a twentieth.
constexpr std::size_t kObjectShare = kSanitized ? 20 : 1;

class CountingSink : public core::EventSink {
 public:
  void serviceUpserted(core::Service s) override {
    ++services;
    sawSmall = sawSmall || s.name == "small";
  }
  void serviceDeleted(const std::string&, const std::string&) override {}
  void endpointSliceUpserted(core::EndpointSlice) override { ++slices; }
  void endpointSliceDeleted(const std::string&, const std::string&) override {}
  void nodeUpserted(core::Node) override {}
  void nodeDeleted(const std::string&) override {}
  void servicesSynced() override {}
  void endpointSlicesSynced() override {}
  std::size_t services = 0;
  std::size_t slices = 0;
  bool sawSmall = false;
};

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kproxy-size-caps.XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string serviceJson(std::size_t i) {
  return fmt::format(
      R"({{"apiVersion":"v1","kind":"Service","metadata":{{"namespace":"ns{}","name":"svc-{}"}},)"
      R"("spec":{{"clusterIP":"10.{}.{}.{}","ports":[{{"name":"http","port":80,"targetPort":8080}}]}}}})",
      i % 100, i, (i >> 16) & 255, (i >> 8) & 255, i & 255);
}

/// A JSON List of Services of exactly `size` bytes (padded with spaces).
std::string serviceListOfSize(std::size_t size, std::size_t& count) {
  std::string text = R"({"apiVersion":"v1","kind":"List","items":[)";
  const std::string tail = "]}\n";
  count = 0;
  for (;;) {
    const std::string item = serviceJson(count);
    const std::size_t comma = count ? 1 : 0;
    if (text.size() + comma + item.size() + tail.size() > size) break;
    if (comma) text += ',';
    text += item;
    ++count;
  }
  text.append(size - text.size() - tail.size(), ' ');
  text += tail;
  return text;
}

void writeFile(const fs::path& path, std::string_view content) {
  std::ofstream out(path, std::ios::binary);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  REQUIRE(out.good());
}

long peakRssKiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

/// Feeds `body` to the watch framing in `readSize` pieces, as the API client does, and hands
/// every line to `onLine`. Returns the number of lines, or -1 when the stream is refused.
template <typename OnLine>
long long readWatchBody(std::string_view body, std::size_t readSize, OnLine onLine) {
  apiwatch::detail::WatchLineSplitter stream(kEventCap);
  long long lines = 0;
  for (std::size_t offset = 0; offset < body.size(); offset += readSize) {
    stream.data().append(body.substr(offset, readSize));
    while (auto line = stream.nextLine()) {
      onLine(*line);
      ++lines;
    }
    if (!stream.compact()) return -1;
  }
  return lines;
}

/// The object of the watch event on `line`.
json eventObject(std::string_view line) {
  auto event = apiwatch::decodeWatchEvent(json::parse(line));
  REQUIRE(event);
  return std::move(event->object);
}

/// CPU seconds of this process (every thread): unlike the wall clock, what a busy machine's
/// other processes take does not count.
double cpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

/// Reads `dir` with a ManifestSource into `sink`; returns the CPU seconds it took.
double readManifests(const std::filesystem::path& dir, CountingSink& sink, std::size_t readFailures) {
  const double start = cpuSeconds();
  apiwatch::ManifestSource source(dir, sink);
  REQUIRE(source.start());
  const auto stats = source.stats();
  CHECK(stats.fileReadFailures == readFailures);
  CHECK(stats.documentFailures == 0);
  source.stop();
  return cpuSeconds() - start;
}

}  // namespace

TEST_CASE("a manifest file of exactly 64 MiB is read, one byte more is refused", "[unit]") {
  // Under sanitizers: only the refusal (see kObjectShare).
  TempDir dir;
  std::size_t count = 0;
  if (!kSanitized) {
    const std::string atCap = serviceListOfSize(kManifestCap, count);
    REQUIRE(atCap.size() == kManifestCap);
    writeFile(dir.path() / "a-at-cap.json", atCap);
  }
  {
    // Over the cap, refused from its size alone: the content is never parsed.
    std::string overCap(kManifestCap + 1, '\n');
    overCap.replace(0, 40, "# one byte over the cap of 64 MiB      \n");
    writeFile(dir.path() / "b-over-cap.yaml", overCap);
  }
  writeFile(dir.path() / "c-small.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: small}\n"
                                          "spec: {ports: [{port: 1}]}\n");
  // The baseline, measured in the same run: a file of an eighth of the cap.
  double baselineSeconds = 0;
  std::size_t baselineCount = 0;
  if (!kSanitized) {
    TempDir small;
    writeFile(small.path() / "eighth.json", serviceListOfSize(kManifestCap / 8, baselineCount));
    CountingSink baseline;
    baselineSeconds = readManifests(small.path(), baseline, 0);
    CHECK(baseline.services == baselineCount);
  }
  CountingSink sink;
  const long rssBefore = peakRssKiB();
  const double seconds = readManifests(dir.path(), sink, 1);
  CHECK(sink.services == count + 1);
  CHECK(sink.sawSmall);
  const long grownMiB = (peakRssKiB() - rssBefore) / 1024;
  INFO("services: " << count << ", read in " << seconds << " CPU s; an eighth of the cap ("
                    << baselineCount << " services) in " << baselineSeconds << " CPU s; peak RSS grew by "
                    << grownMiB << " MiB");
  // Bounded memory: the text, its tree for one item at a time and the decoded objects (the
  // sink here keeps none). Bounded time, against the baseline: eight times the text costs
  // about eight times the work when parsing is linear, sixty-four times when it is quadratic
  // in the number of items (such a parse took 28 s where the linear one takes 3 s). CPU time,
  // not the wall clock: a busy machine slows both alike. Sanitizers make both figures
  // meaningless.
  if (!kSanitized) {
    CHECK(grownMiB < 1024);
    CHECK(seconds < 24 * std::max(baselineSeconds, 0.01));
  }
}

TEST_CASE("an EndpointSlice as large as a watch event may be (64 MiB) is framed in bounded time",
          "[unit]") {
  if (kSanitized) return;  // see kObjectShare
  {
    std::string body =
        R"({"type":"ADDED","object":{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",)"
        R"("metadata":{"namespace":"big","name":"huge"},"addressType":"IPv4",)"
        R"("ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[)";
    const std::string endpoint =
        R"({"addresses":["10.1.2.3"],"conditions":{"ready":true,"serving":true,"terminating":false},"nodeName":"node-0001"},)";
    const std::string tail = "]}}\n";
    // Grow the endpoints until the event line is just under the cap.
    std::size_t endpoints = 0;
    while (body.size() + endpoint.size() + tail.size() < kEventCap) {
      body += endpoint;
      ++endpoints;
    }
    body.pop_back();  // the last comma
    body += tail;
    // The framing alone, in 4 KiB reads (a read returns what the socket holds, often less
    // than the client's 16 KiB): linear work is a few tens of milliseconds (more under
    // sanitizers); scanning the whole pending line again after every read is half a terabyte.
    // The ceiling is CPU time, far above the linear figure and far below the rescan's.
    std::string line;
    const double start = cpuSeconds();
    CHECK(readWatchBody(body, 4096, [&](std::string_view l) { line = l; }) == 1);
    const double framingSeconds = cpuSeconds() - start;
    INFO("framing took " << framingSeconds << " CPU s");
    CHECK(framingSeconds < 20);
    auto slice = apiwatch::decodeEndpointSlice(eventObject(line));
    REQUIRE(slice);
    CHECK(slice->endpoints.size() == endpoints);
  }
}

TEST_CASE("watch events over the cap are refused; a Service with many ports decodes", "[unit]") {
  SECTION("one byte over the cap without a newline is refused") {
    std::string body(kEventCap + 1, ' ');
    body[0] = '{';
    CHECK(readWatchBody(body, 16384, [](std::string_view) {}) == -1);
  }

  SECTION("a Service with 200,000 ports (10,000 under sanitizers)") {
    json ports = json::array();
    const int count = 200000 / static_cast<int>(kObjectShare);
    for (int i = 0; i < count; ++i)
      ports.push_back({{"name", fmt::format("p{}", i)}, {"port", 1 + i % 65535}, {"protocol", "UDP"}});
    json service = {{"apiVersion", "v1"},
                    {"kind", "Service"},
                    {"metadata", {{"name", "wide"}}},
                    {"spec", {{"clusterIP", "10.0.0.1"}, {"ports", ports}}}};
    const std::string body = json{{"type", "MODIFIED"}, {"object", service}}.dump() + "\n";
    REQUIRE(body.size() < kEventCap);
    std::size_t decoded = 0;
    CHECK(readWatchBody(body, 16384, [&](std::string_view line) {
            auto s = apiwatch::decodeService(eventObject(line));
            REQUIRE(s);
            decoded = s->ports.size();
          }) == 1);
    CHECK(decoded == static_cast<std::size_t>(count));
  }
}
