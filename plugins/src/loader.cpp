#include "kproxy/plugins/loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "kproxy/core/log.h"
#include "file_trust.h"
#include "kproxy/plugin/abi.h"
#include "snapshot_bridge.h"

namespace kproxy::plugins {
namespace {

using core::ErrorCategory;
using core::makeError;

std::string quote(const std::filesystem::path& p) { return "plugin " + p.string(); }

// A plugin's error message under its backend's name: "NAME: MESSAGE", unless the plugin named
// itself already (the built-in backends' messages begin "nftables: ", "ipvs: " and so on).
std::string named(std::string_view name, const std::string& message) {
  const std::string prefix = std::string(name) + ": ";
  return message.starts_with(prefix) ? message : prefix + message;
}

// Whether the descriptor is big enough to hold `Field` (fields appended in later minor
// versions are read only then).
template <typename Field>
bool covers(const kproxy_plugin_descriptor* d, Field kproxy_plugin_descriptor::*field) {
  const auto* base = reinterpret_cast<const char*>(d);
  const auto* at = reinterpret_cast<const char*>(&(d->*field));
  return d->struct_size >= static_cast<std::size_t>(at - base) + sizeof(Field);
}

// The host's category for a plugin's kproxy_error.category (KPROXY_ERROR_UNKNOWN, and what a
// 1.0/1.1 plugin leaves zeroed, is kPlugin: the plugin did not say).
ErrorCategory categoryOf(const kproxy_error& err) {
  switch (err.category) {
    case KPROXY_ERROR_KERNEL_REFUSED: return ErrorCategory::kKernel;
    case KPROXY_ERROR_INVALID_INPUT: return ErrorCategory::kInvalidArgument;
    case KPROXY_ERROR_TRANSIENT: return ErrorCategory::kTransient;
    default: return ErrorCategory::kPlugin;
  }
}

void appendText(void* user, const char* text, std::size_t len) {
  if (text != nullptr) static_cast<std::string*>(user)->append(text, len);
}

// Adapts a plugin instance to core::Backend.
class LoadedBackend final : public PluginBackend {
 public:
  LoadedBackend(const kproxy_plugin_descriptor* descriptor, kproxy_backend* handle)
      : descriptor_(descriptor), handle_(handle) {}
  LoadedBackend(const LoadedBackend&) = delete;
  LoadedBackend& operator=(const LoadedBackend&) = delete;
  ~LoadedBackend() override { descriptor_->destroy(handle_); }

  bool canExplain() const override {
    return covers(descriptor_, &kproxy_plugin_descriptor::explain) &&
           descriptor_->explain != nullptr;
  }

  core::Result<std::string> explain(const core::Snapshot& snapshot,
                                    const ExplainRequest& request) override {
    if (!canExplain()) {
      return makeError(ErrorCategory::kPlugin,
                       "backend " + std::string(descriptor_->name) +
                           " cannot explain: its plugin has no explain entry point");
    }
    kproxy_explain_request r{};
    r.struct_size = sizeof r;
    r.family = static_cast<std::uint8_t>(request.family);
    r.protocol = static_cast<std::uint8_t>(request.protocol);
    r.destination_port = request.destinationPort;
    r.flags = (request.fromNode ? KPROXY_EXPLAIN_FROM_NODE : 0u) |
              (request.json ? KPROXY_EXPLAIN_JSON : 0u);
    r.source_ip = request.sourceIP.c_str();
    r.destination_ip = request.destinationIP.c_str();
    r.input_interface = request.inputInterface.c_str();
    std::string text;
    kproxy_error err{};
    if (descriptor_->explain(handle_, toC(&snapshot), &r, &appendText, &text, &err) != KPROXY_OK) {
      return makeError(ErrorCategory::kPlugin,
                       "backend " + std::string(descriptor_->name) + ": " + terminated(err.message),
                       err.errnum);
    }
    return text;
  }

  std::string_view name() const override { return descriptor_->name; }

  core::Result<core::SyncResult> sync(const core::SyncRequest& request) override {
    std::vector<kproxy_changed_key> changed;
    changed.reserve(request.changed.size());
    for (const auto& key : request.changed) {
      changed.push_back({static_cast<std::uint8_t>(key.family), key.name.c_str()});
    }
    kproxy_sync_result result{};
    result.struct_size = sizeof result;
    kproxy_error err{};
    std::uint32_t flags = request.kind == core::SyncKind::kFull ? KPROXY_SYNC_FULL : 0u;
    int rc = descriptor_->sync(handle_, request.previous ? toC(request.previous) : nullptr,
                               toC(request.next), changed.data(), changed.size(), flags, &result,
                               &err);
    if (rc != KPROXY_OK) {
      return makeError(categoryOf(err),
                       named(descriptor_->name, terminated(err.message)), err.errnum);
    }
    return core::SyncResult{static_cast<std::size_t>(result.operations),
                            terminated(result.summary)};
  }

  core::Result<void> cleanup() override {
    kproxy_error err{};
    if (descriptor_->cleanup(handle_, &err) != KPROXY_OK) {
      return makeError(categoryOf(err),
                       std::string(descriptor_->name) + " cleanup: " + terminated(err.message),
                       err.errnum);
    }
    return {};
  }

 private:
  template <std::size_t N>
  static std::string terminated(const char (&buffer)[N]) {
    return std::string(buffer, strnlen(buffer, N));
  }
  const kproxy_plugin_descriptor* descriptor_;
  kproxy_backend* handle_;
};

}  // namespace

struct PluginRegistry::Loaded {
  void* dl = nullptr;
  const kproxy_plugin_descriptor* descriptor = nullptr;
  PluginInfo info;
  ~Loaded() {
    if (dl != nullptr) dlclose(dl);
  }
};

PluginRegistry::PluginRegistry() : hostApi_(makeHostApi(&metrics_)) {}
PluginRegistry::~PluginRegistry() = default;

core::Result<PluginInfo> PluginRegistry::load(const std::filesystem::path& file) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    return makeError(ErrorCategory::kNotFound, quote(file) + ": no such file", ENOENT);
  }
  if (!std::filesystem::is_regular_file(file, ec)) {
    return makeError(ErrorCategory::kPlugin, quote(file) + ": not a regular file");
  }
  // dlopen runs the plugin's constructors in a process that is usually root.
  if (auto trusted = detail::checkTrustedPath(file, detail::trustedOwners()); !trusted) {
    return makeError(ErrorCategory::kPlugin, quote(file) + ": refused: " + trusted.error().context,
                     trusted.error().errnum);
  }
  // An absolute path keeps dlopen from searching the library path.
  auto path = std::filesystem::absolute(file, ec);
  auto loaded = std::make_unique<Loaded>();
  dlerror();
  loaded->dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (loaded->dl == nullptr) {
    const char* why = dlerror();
    return makeError(ErrorCategory::kPlugin, quote(file) + ": not a loadable shared object (" +
                                                 std::string(why ? why : "unknown") + ")");
  }
  auto entry = reinterpret_cast<kproxy_plugin_entry_fn>(dlsym(loaded->dl, KPROXY_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    return makeError(ErrorCategory::kPlugin,
                     quote(file) + ": does not export " + KPROXY_PLUGIN_ENTRY_SYMBOL);
  }
  const kproxy_plugin_descriptor* d = entry();
  if (d == nullptr) {
    return makeError(ErrorCategory::kPlugin,
                     quote(file) + ": " + KPROXY_PLUGIN_ENTRY_SYMBOL + " returned no descriptor");
  }
  if (d->abi_version != KPROXY_PLUGIN_ABI_VERSION) {
    return makeError(ErrorCategory::kPlugin,
                     quote(file) + ": plugin ABI version " + std::to_string(d->abi_version) +
                         ", but this kproxy supports ABI version " +
                         std::to_string(KPROXY_PLUGIN_ABI_VERSION));
  }
  // A plugin built against an older 1.x header has a shorter descriptor: what it lacks is
  // optional and read only where struct_size covers it.
  if (d->struct_size < KPROXY_PLUGIN_DESCRIPTOR_V1_0_SIZE) {
    return makeError(ErrorCategory::kPlugin,
                     quote(file) + ": descriptor is " + std::to_string(d->struct_size) +
                         " bytes, ABI version 1 needs at least " +
                         std::to_string(KPROXY_PLUGIN_DESCRIPTOR_V1_0_SIZE));
  }
  if (d->name == nullptr || d->name[0] == '\0' || d->create == nullptr || d->sync == nullptr ||
      d->cleanup == nullptr || d->destroy == nullptr) {
    return makeError(ErrorCategory::kPlugin,
                     quote(file) + ": descriptor lacks a name or an entry point");
  }
  for (const auto& other : loaded_) {
    if (other->info.name == d->name) {
      return makeError(ErrorCategory::kPlugin, quote(file) + ": a plugin named \"" + d->name +
                                                   "\" is already loaded from " +
                                                   other->info.path.string());
    }
  }
  loaded->descriptor = d;
  std::uint32_t minor = covers(d, &kproxy_plugin_descriptor::abi_minor) ? d->abi_minor
                        : covers(d, &kproxy_plugin_descriptor::explain) ? 1u
                                                                        : 0u;
  loaded->info = PluginInfo{d->name, d->version ? d->version : "",
                            d->description ? d->description : "", path, minor};
  PluginInfo info = loaded->info;
  loaded_.push_back(std::move(loaded));
  log::info(2, "loaded plugin", {{"name", info.name}, {"version", info.version},
                                 {"abi", "1." + std::to_string(info.abiMinor)},
                                 {"path", info.path.string()}});
  return info;
}

std::vector<core::Error> PluginRegistry::loadDirectory(const std::filesystem::path& dir) {
  std::vector<core::Error> errors;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    errors.push_back(core::Error{ErrorCategory::kNotFound, ENOENT,
                                 "plugin directory " + dir.string() + ": not a directory"});
    return errors;
  }
  // A directory others can write to is refused as a whole: one line, not one per file.
  if (auto trusted = detail::checkTrustedPath(dir, detail::trustedOwners()); !trusted) {
    errors.push_back(core::Error{ErrorCategory::kPlugin, trusted.error().errnum,
                                 "plugin directory " + dir.string() + ": refused: " + trusted.error().context});
    return errors;
  }
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".so") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    if (auto r = load(f); !r) errors.push_back(r.error());
  }
  return errors;
}

void PluginRegistry::unloadAllBut(std::string_view name) {
  std::erase_if(loaded_, [&](const auto& l) { return l->info.name != name; });
}

std::vector<PluginInfo> PluginRegistry::plugins() const {
  std::vector<PluginInfo> out;
  for (const auto& l : loaded_) out.push_back(l->info);
  std::sort(out.begin(), out.end(),
            [](const PluginInfo& a, const PluginInfo& b) { return a.name < b.name; });
  return out;
}

bool PluginRegistry::has(std::string_view name) const {
  return std::any_of(loaded_.begin(), loaded_.end(),
                     [&](const auto& l) { return l->info.name == name; });
}

std::string PluginRegistry::names() const {
  std::string out;
  for (const auto& p : plugins()) {
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out.empty() ? "(none loaded)" : out;
}

core::Result<std::unique_ptr<core::Backend>> PluginRegistry::createBackend(
    std::string_view name, const BackendOptions& options) const {
  auto backend = createPluginBackend(name, options);
  if (!backend) return std::unexpected(backend.error());
  return std::unique_ptr<core::Backend>(std::move(*backend));
}

core::Result<std::unique_ptr<PluginBackend>> PluginRegistry::createPluginBackend(
    std::string_view name, const BackendOptions& options) const {
  for (const auto& l : loaded_) {
    if (l->info.name != name) continue;
    std::vector<kproxy_option> opts;
    opts.reserve(options.size());
    for (const auto& [k, v] : options) opts.push_back({k.c_str(), v.c_str()});
    kproxy_error err{};
    kproxy_backend* handle = l->descriptor->create(&hostApi_, opts.data(), opts.size(), &err);
    if (handle == nullptr) {
      return makeError(ErrorCategory::kPlugin,
                       named(name, std::string(err.message, strnlen(err.message, sizeof err.message))), err.errnum);
    }
    return std::unique_ptr<PluginBackend>(std::make_unique<LoadedBackend>(l->descriptor, handle));
  }
  return makeError(ErrorCategory::kNotFound,
                   "unknown proxy mode \"" + std::string(name) + "\"; available: " + names());
}

std::vector<std::filesystem::path> defaultPluginDirs() {
  std::vector<std::filesystem::path> candidates;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // Build tree: <build>/cli/kproxy next to <build>/plugins-out.
    std::filesystem::path build(KPROXY_BUILD_PLUGIN_DIR);
    if (exe.parent_path().parent_path() == build.parent_path()) candidates.push_back(build);
    // Install tree: <prefix>/bin/kproxy next to <prefix>/<libdir>/kproxy/plugins.
    candidates.push_back(exe.parent_path().parent_path() / KPROXY_INSTALL_PLUGIN_SUBDIR);
  }
  candidates.emplace_back(KPROXY_INSTALL_PLUGIN_DIR);
  std::vector<std::filesystem::path> out;
  for (auto& c : candidates) {
    c = c.lexically_normal();
    if (std::filesystem::is_directory(c, ec) && std::find(out.begin(), out.end(), c) == out.end()) {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace kproxy::plugins
