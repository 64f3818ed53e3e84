// The KubeProxyConfiguration decoder (`kproxy --config FILE`, YAML or JSON). What it accepts
// must survive the trip through --write-config-to: decodeConfig(toYaml(c)) gives c back.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "config_file.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kproxy;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = cli::decodeConfig(text, "fuzz.yaml");
  if (!config) {
    KPROXY_FUZZ_CHECK(!config.error().message().empty(), "a refusal says why");
    return 0;
  }
  const std::string yaml = cli::toYaml(*config);
  auto again = cli::decodeConfig(yaml, "written.yaml");
  if (!again) std::fprintf(stderr, "%s\n---\n%s\n", yaml.c_str(), again.error().message().c_str());
  KPROXY_FUZZ_CHECK(again.has_value(), "what was accepted is written back decodably");
  if (!(*again == *config))
    std::fprintf(stderr, "written:\n%s\nread back and written again:\n%s\n", yaml.c_str(),
                 cli::toYaml(*again).c_str());
  KPROXY_FUZZ_CHECK(*again == *config, "decodeConfig(toYaml(c)) == c");
  (void)cli::toJson(*config);
  (void)cli::toConfigzJson(*config);
  return 0;
}
