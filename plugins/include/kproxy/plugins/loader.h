#pragma once
/// Host side of the plugin ABI: loads backend plugins (shared objects exporting
/// kproxy_plugin_entry) and adapts them to core::Backend.
///
/// Every refusal is one line naming the file and the reason: missing file, not a shared
/// object, no entry point, entry returning null, ABI version mismatch, duplicate name.
/// Not thread-safe (except metrics()); a registry must outlive every backend it created.
///
/// A plugin's kproxy_error.category (ABI 1.2) becomes the core::Error category of a failed
/// sync or cleanup: kernel refused → kKernel, invalid input → kInvalidArgument, transient →
/// kTransient, not said (and every 1.0/1.1 plugin) → kPlugin.

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/backend.h"
#include "kproxy/core/error.h"
#include "kproxy/core/model.h"
#include "kproxy/core/snapshot.h"
#include "kproxy/plugin/abi.h"
#include "kproxy/plugins/plugin_metrics.h"

namespace kproxy::plugins {

struct PluginInfo {
  std::string name;
  std::string version;
  std::string description;
  std::filesystem::path path;
  /// The ABI minor version the plugin was built against (0, 1 from its descriptor's size).
  std::uint32_t abiMinor = 0;
};

using BackendOptions = std::map<std::string, std::string>;

/// The first packet of a new connection, for PluginBackend::explain.
struct ExplainRequest {
  net::Family family = net::Family::kIPv4;
  core::Protocol protocol = core::Protocol::kTCP;
  std::string sourceIP;  ///< numeric, of `family`
  std::string destinationIP;
  std::uint16_t destinationPort = 0;
  bool fromNode = false;       ///< sent by the node itself
  std::string inputInterface;  ///< empty when unknown
  bool json = false;
};

/// A backend created from a plugin: a core::Backend plus what only plugins offer.
class PluginBackend : public core::Backend {
 public:
  /// Whether the plugin has the explain entry point (ABI 1.1). A plugin that has it may still
  /// answer "not supported".
  virtual bool canExplain() const = 0;
  /// The plugin's explanation (text or JSON) of where `request`'s packet would go under what it
  /// would program for `snapshot`; never touches the kernel. An error names the backend; a
  /// plugin without the entry point gives "backend NAME cannot explain ...".
  virtual core::Result<std::string> explain(const core::Snapshot& snapshot,
                                            const ExplainRequest& request) = 0;
};

class PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  /// Loads one plugin file (dlopen RTLD_NOW|RTLD_LOCAL) and registers it by name.
  core::Result<PluginInfo> load(const std::filesystem::path& file);
  /// Loads every "*.so" in `dir` (sorted). Returns one error per refused file; a missing
  /// directory is one error. Files that load are registered even when others fail.
  std::vector<core::Error> loadDirectory(const std::filesystem::path& dir);

  /// Unloads (dlclose) every plugin but the one named `name`, whose backend the host is about
  /// to create: the others' code, data and libraries would stay resident for nothing.
  /// Precondition: no backend of the unloaded plugins exists.
  void unloadAllBut(std::string_view name);

  std::vector<PluginInfo> plugins() const;  ///< sorted by name
  bool has(std::string_view name) const;
  /// "iptables, nftables" — for error messages.
  std::string names() const;

  /// Creates a backend from the plugin named `name`.
  core::Result<std::unique_ptr<core::Backend>> createBackend(std::string_view name,
                                                             const BackendOptions& options) const;
  /// The same, keeping the plugin-only operations (explain).
  core::Result<std::unique_ptr<PluginBackend>> createPluginBackend(
      std::string_view name, const BackendOptions& options) const;

  /// The metrics plugins register through the host API (ABI 1.2), for /metrics. Reserve the
  /// host's own name prefixes before creating a backend.
  PluginMetrics& metrics() { return metrics_; }
  const PluginMetrics& metrics() const { return metrics_; }

 private:
  struct Loaded;
  std::vector<std::unique_ptr<Loaded>> loaded_;
  PluginMetrics metrics_;
  kproxy_host_api hostApi_;  ///< handed to every backend; host_ctx is &metrics_
};

/// Where kproxy finds its built-in plugins with no flag: the build tree's plugin directory
/// (when running from the build tree), then <prefix>/lib/kproxy/plugins relative to the
/// running executable, then the configured install directory. Only existing directories.
std::vector<std::filesystem::path> defaultPluginDirs();

}  // namespace kproxy::plugins
