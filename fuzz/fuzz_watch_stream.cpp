// The watch stream as the API client reads it: body bytes arrive in pieces of any size (HTTP
// chunks and TCP reads split lines anywhere), are framed into lines, each line is parsed as
// JSON, decoded as a watch event, and its object decoded by the watched resource's decoder.
//
// Input: byte 0 picks the read size (1..64 bytes), byte 1 the decoder (Service, EndpointSlice,
// Node), the rest is the body. The lines handed out are checked against a plain split.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "decoded_invariants.h"
#include "watch_stream.h"

namespace {

/// The complete non-blank lines of `body`, the obvious way.
std::vector<std::string> referenceLines(std::string_view body) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  for (std::size_t nl; (nl = body.find('\n', start)) != std::string_view::npos; start = nl + 1) {
    std::string_view line = body.substr(start, nl - start);
    if (line.find_first_not_of(" \r\t") != std::string_view::npos) lines.emplace_back(line);
  }
  return lines;
}

void decodeLine(std::string_view line, unsigned which) {
  using namespace kproxy;
  auto parsed = nlohmann::json::parse(line, nullptr, false);
  if (parsed.is_discarded()) return;  // the client reopens the watch
  auto event = apiwatch::decodeWatchEvent(std::move(parsed));
  if (!event || event->type == apiwatch::WatchEventType::kError) return;
  switch (which % 3) {
    case 0:
      if (auto s = apiwatch::decodeService(event->object)) fuzz::checkDecoded(*s);
      break;
    case 1:
      if (auto e = apiwatch::decodeEndpointSlice(event->object)) fuzz::checkDecoded(*e);
      break;
    default:
      if (auto n = apiwatch::decodeNode(event->object)) fuzz::checkDecoded(*n);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kproxy;
  if (size < 2) return 0;
  const std::size_t readSize = 1 + data[0] % 64;
  const unsigned which = data[1];
  std::string_view body(reinterpret_cast<const char*>(data) + 2, size - 2);
  // A small limit, so that inputs reach the "event line too long" path too.
  constexpr std::size_t kMaxPending = 1024;

  const auto expected = referenceLines(body);
  std::size_t seen = 0;
  apiwatch::detail::WatchLineSplitter stream(kMaxPending);
  bool broken = false;
  for (std::size_t offset = 0; offset < body.size() && !broken; offset += readSize) {
    stream.data().append(body.substr(offset, readSize));
    while (auto line = stream.nextLine()) {
      KPROXY_FUZZ_CHECK(line->find('\n') == std::string_view::npos, "a line holds no newline");
      KPROXY_FUZZ_CHECK(seen < expected.size() && *line == expected[seen], "lines as split by hand");
      ++seen;
      decodeLine(*line, which);
    }
    if (!stream.compact()) {
      KPROXY_FUZZ_CHECK(stream.data().size() > kMaxPending, "refused only above the limit");
      KPROXY_FUZZ_CHECK(stream.data().find('\n') == std::string::npos, "only an incomplete line is pending");
      broken = true;
    }
  }
  if (!broken) KPROXY_FUZZ_CHECK(seen == expected.size(), "every complete line is handed out");
  return 0;
}
