// The manifest parser as `kproxy --manifests DIR` uses it on each file: multi-document YAML,
// JSON, List objects (kind: List, ServiceList, ...), then the object decoders.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "decoded_invariants.h"
#include "manifest_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kproxy;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto entries = apiwatch::parseManifest(text, apiwatch::ManifestFormat::KPROXY_FUZZ_MANIFEST_FORMAT);
  const std::size_t lines = 1 + static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
  std::size_t previousDocument = 0;
  for (const auto& entry : entries) {
    KPROXY_FUZZ_CHECK(entry.document >= 1, "documents are numbered from 1");
    KPROXY_FUZZ_CHECK(entry.document >= previousDocument, "entries come in document order");
    KPROXY_FUZZ_CHECK(entry.line >= 1 && entry.line <= lines + 1, "an entry's line is in the file");
    previousDocument = entry.document;
    if (entry.object) {
      fuzz::checkDecoded(*entry.object);
    } else {
      KPROXY_FUZZ_CHECK(!entry.object.error().message().empty(), "a failure says why");
    }
  }
  return 0;
}
