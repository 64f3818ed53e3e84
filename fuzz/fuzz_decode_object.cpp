// The object decoders on one JSON object, as the API client hands them a LIST item or a watch
// event's object: decodeObject's dispatch, each typed decoder, Status and watch events.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "decoded_invariants.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kproxy;
  using nlohmann::json;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  json object = json::parse(text, nullptr, false);
  if (object.is_discarded()) return 0;

  auto decoded = apiwatch::decodeObject(object);
  if (decoded) fuzz::checkDecoded(*decoded);

  // The API client calls the typed decoder of the resource it watches, whatever the kind says.
  auto service = apiwatch::decodeService(object);
  if (service) fuzz::checkDecoded(*service);
  auto slice = apiwatch::decodeEndpointSlice(object);
  if (slice) fuzz::checkDecoded(*slice);
  auto node = apiwatch::decodeNode(object);
  if (node) fuzz::checkDecoded(*node);
  // The dispatch and the typed decoder agree on the kinds kproxy consumes.
  if (decoded && std::holds_alternative<core::Service>(*decoded))
    KPROXY_FUZZ_CHECK(service && *service == std::get<core::Service>(*decoded), "decodeObject = decodeService");
  if (decoded && std::holds_alternative<core::EndpointSlice>(*decoded))
    KPROXY_FUZZ_CHECK(slice && *slice == std::get<core::EndpointSlice>(*decoded),
                      "decodeObject = decodeEndpointSlice");
  if (decoded && std::holds_alternative<core::Node>(*decoded))
    KPROXY_FUZZ_CHECK(node && *node == std::get<core::Node>(*decoded), "decodeObject = decodeNode");

  (void)apiwatch::decodeStatus(object);
  auto event = apiwatch::decodeWatchEvent(object);
  if (event) {
    KPROXY_FUZZ_CHECK(event->object.is_object(), "a watch event holds an object");
    KPROXY_FUZZ_CHECK(event->status.has_value() == (event->type == apiwatch::WatchEventType::kError),
                      "only ERROR events carry a Status");
    KPROXY_FUZZ_CHECK(apiwatch::toString(event->type) != nullptr, "event types have names");
  }
  return 0;
}
