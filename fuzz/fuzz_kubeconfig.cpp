// The kubeconfig loader as `kproxy --kubeconfig FILE` runs it (the input is written to a file,
// since relative paths resolve against its directory), plus the server URL and base64
// decoders it uses, on the raw input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kproxy/apiwatch/kubeconfig.h"

namespace {

const std::filesystem::path& kubeconfigPath() {
  static const std::filesystem::path path = [] {
    std::string dir = (std::filesystem::temp_directory_path() / "kproxy-fuzz-kubeconfig.XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    return std::filesystem::path(dir) / "kubeconfig";
  }();
  // Registered once the path exists, so it runs before the path is destroyed.
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(path.parent_path(), ec);
    });
    return true;
  }();
  (void)cleanup;
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kproxy;
  std::string_view text(reinterpret_cast<const char*>(data), size);

  if (auto url = apiwatch::parseServerUrl(std::string(text))) {
    KPROXY_FUZZ_CHECK(!url->host.empty(), "a parsed server URL has a host");
    KPROXY_FUZZ_CHECK(url->port != 0, "a parsed server URL has a port");
  }
  if (auto bytes = apiwatch::decodeBase64(text)) {
    KPROXY_FUZZ_CHECK(bytes->size() <= text.size() / 4 * 3, "base64 decodes to at most 3/4 of its length");
  }

  {
    std::ofstream out(kubeconfigPath(), std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  if (auto config = apiwatch::loadKubeconfig(kubeconfigPath())) {
    KPROXY_FUZZ_CHECK(!config->server.host.empty(), "a loaded kubeconfig names a server host");
    KPROXY_FUZZ_CHECK(config->server.port != 0, "a loaded kubeconfig names a server port");
  }
  return 0;
}
