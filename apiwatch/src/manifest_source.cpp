#include "kproxy/apiwatch/manifest_source.h"

#include <malloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <compare>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <openssl/evp.h>

#include "kproxy/apiwatch/decode.h"
#include "kproxy/core/log.h"
#include "manifest_parser.h"

namespace kproxy::apiwatch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// IN_MODIFY is not a trigger of its own value: it keeps the debounce open while a writer is still
// writing in place, so a half-written file is not read.
constexpr std::uint32_t kWatchMask = IN_CLOSE_WRITE | IN_MODIFY | IN_MOVED_TO | IN_MOVED_FROM |
                                     IN_DELETE | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF |
                                     IN_ONLYDIR;
// A runaway file (a log written into the directory by mistake) must not exhaust memory.
constexpr std::uintmax_t kMaxFileBytes = 64u << 20;
constexpr int kRewatchIntervalMs = 1000;
constexpr std::uintmax_t kTrimAfterParsedBytes = 1u << 20;  // as the API source's list trim
constexpr int kMaxDebounceFactor = 5;

enum class ObjectKind : std::uint8_t { kNode, kService, kEndpointSlice, kServiceCIDR };

struct ObjectKey {
  ObjectKind kind;
  std::string ns;
  std::string name;
  auto operator<=>(const ObjectKey&) const = default;
};

std::string describe(const ObjectKey& key) {
  switch (key.kind) {
    case ObjectKind::kNode:
      return fmt::format("Node {}", key.name);
    case ObjectKind::kService:
      return fmt::format("Service {}/{}", key.ns, key.name);
    case ObjectKind::kEndpointSlice:
      return fmt::format("EndpointSlice {}/{}", key.ns, key.name);
    case ObjectKind::kServiceCIDR:
      return fmt::format("ServiceCIDR {}", key.name);
  }
  return "?";
}

std::optional<ObjectKey> keyOf(const DecodedObject& object) {
  if (const auto* s = std::get_if<core::Service>(&object))
    return ObjectKey{ObjectKind::kService, s->ns, s->name};
  if (const auto* e = std::get_if<core::EndpointSlice>(&object))
    return ObjectKey{ObjectKind::kEndpointSlice, e->ns, e->name};
  if (const auto* n = std::get_if<core::Node>(&object))
    return ObjectKey{ObjectKind::kNode, {}, n->name};
  if (const auto* c = std::get_if<core::ServiceCIDR>(&object))
    return ObjectKey{ObjectKind::kServiceCIDR, {}, c->name};
  return std::nullopt;
}

/// Where an object was read, for duplicate warnings.
struct Origin {
  std::string file;
  std::size_t document = 1;
  std::optional<std::size_t> item;
  std::string str() const {
    return item.has_value() ? fmt::format("{} document {} items[{}]", file, document, *item)
                            : fmt::format("{} document {}", file, document);
  }
};

/// A decoded object is immutable once read: the file's record, the desired set and the set
/// delivered to the sink all point at the same one instead of holding copies.
using SharedObject = std::shared_ptr<const DecodedObject>;
using ObjectMap = std::map<ObjectKey, SharedObject>;

/// An object as parsed from one file; the origin is only needed while the file is parsed.
struct Located {
  SharedObject object;
  Origin origin;
};

/// Identifies a file's content without keeping it: a directory of large manifests would
/// otherwise hold all of its text for as long as kproxy runs.
struct ContentDigest {
  std::size_t size = 0;
  std::array<unsigned char, 32> sha256{};
  bool operator==(const ContentDigest&) const = default;
};

ContentDigest digestOf(std::string_view content) {
  ContentDigest digest;
  digest.size = content.size();
  unsigned int length = 0;
  // SHA-256 of a string in memory cannot fail short of an allocation failure; an all-zero
  // digest then only makes the file be parsed again.
  if (EVP_Digest(content.data(), content.size(), digest.sha256.data(), &length, EVP_sha256(),
                 nullptr) != 1)
    digest.sha256.fill(0);
  return digest;
}

struct FileRecord {
  /// Of the last content parsed; an unchanged file is not parsed (nor logged) again.
  std::optional<ContentDigest> digest;
  /// Objects from the last version of the file that had no errors.
  std::shared_ptr<const ObjectMap> lastClean = std::make_shared<const ObjectMap>();
  /// What the file contributes now: the same map as lastClean while the file has no errors.
  std::shared_ptr<const ObjectMap> effective = lastClean;
};

std::optional<ManifestFormat> formatOf(const std::string& name) {
  if (name.empty() || name.front() == '.') return std::nullopt;  // hidden, editor swap, temp
  fs::path p(name);
  const std::string ext = p.extension().string();
  if (ext == ".yaml" || ext == ".yml") return ManifestFormat::kYaml;
  if (ext == ".json") return ManifestFormat::kJson;
  return std::nullopt;  // also rejects backups like "a.yaml~" and "#a.yaml#"
}

/// Whether an inotify event may change what we read. ConfigMap volumes swap a "..data"
/// symlink, so names starting with ".." count too.
bool relevantName(std::string_view name) {
  return name.empty() || name.starts_with("..") || formatOf(std::string(name)).has_value();
}

std::string entryWhere(const ManifestEntry& entry) {
  return entry.item.has_value() ? fmt::format("items[{}]", *entry.item) : std::string("-");
}

}  // namespace

struct ManifestSource::Impl {
  Impl(fs::path dir, core::EventSink& s, ManifestSourceOptions opts)
      : directory(std::move(dir)), sink(s), options(opts) {}

  fs::path directory;
  core::EventSink& sink;
  ManifestSourceOptions options;

  int inotifyFd = -1;
  int watchDescriptor = -1;
  int stopFd = -1;
  std::thread thread;
  bool started = false;

  // Owned by whichever thread is reading (start(), then the watcher thread): never shared.
  std::map<std::string, FileRecord> files;  // by file name, so iteration is in name order
  ObjectMap delivered;
  std::set<std::string> reportedDuplicates;
  bool directoryUnreadable = false;
  std::uintmax_t parsedBytes = 0;  // in the current rescan

  std::atomic<std::uint64_t> documentFailures{0};
  std::atomic<std::uint64_t> fileReadFailures{0};
  std::atomic<std::uint64_t> rescans{0};

  ~Impl() { closeFds(); }

  void closeFds() {
    if (inotifyFd >= 0) ::close(inotifyFd);
    if (stopFd >= 0) ::close(stopFd);
    inotifyFd = stopFd = -1;
  }

  bool addWatch() {
    watchDescriptor = ::inotify_add_watch(inotifyFd, directory.c_str(), kWatchMask);
    return watchDescriptor >= 0;
  }

  /// A changed file is decoded whole again. An object equal to the one delivered is replaced by
  /// the delivered one, which the sink keeps too: otherwise every unchanged object of an edited
  /// file would be held twice from then on.
  SharedObject share(const ObjectKey& key, DecodedObject&& object) {
    if (auto it = delivered.find(key); it != delivered.end() && *it->second == object)
      return it->second;
    return std::make_shared<const DecodedObject>(std::move(object));
  }

  /// Parses a file's new content into `record`, logging every problem once.
  void parseFile(const std::string& name, ManifestFormat format, std::string_view content,
                 ContentDigest digest, FileRecord& record) {
    const std::string path = (directory / name).string();
    std::map<ObjectKey, Located> parsed;
    std::size_t failures = 0;
    for (auto& entry : parseManifest(content, format)) {
      if (!entry.object) {
        ++failures;
        log::warning("skipping manifest document", {{"file", path},
                                                    {"document", std::to_string(entry.document)},
                                                    {"item", entryWhere(entry)},
                                                    {"line", std::to_string(entry.line)},
                                                    {"reason", entry.object.error().message()}});
        continue;
      }
      auto key = keyOf(*entry.object);
      if (!key.has_value()) {
        log::info(2, "skipping object of unsupported kind",
                  {{"file", path},
                   {"document", std::to_string(entry.document)},
                   {"item", entryWhere(entry)},
                   {"object", apiwatch::describe(*entry.object)}});
        continue;
      }
      Origin origin{name, entry.document, entry.item};
      if (auto it = parsed.find(*key); it != parsed.end()) {
        log::warning("object defined twice; the later definition wins",
                     {{"object", describe(*key)},
                      {"first", it->second.origin.str()},
                      {"second", origin.str()}});
        it->second = Located{share(*key, std::move(*entry.object)), std::move(origin)};
      } else {
        SharedObject object = share(*key, std::move(*entry.object));
        parsed.emplace(std::move(*key), Located{std::move(object), std::move(origin)});
      }
    }
    documentFailures += failures;
    record.digest = digest;
    if (failures == 0) {
      ObjectMap clean;
      for (auto& [key, located] : parsed)
        clean.emplace_hint(clean.end(), key, std::move(located.object));
      record.lastClean = std::make_shared<const ObjectMap>(std::move(clean));
      record.effective = record.lastClean;
      return;
    }
    // Keep what the file last held when it was valid; the good documents of the new content
    // still apply on top of it.
    ObjectMap effective = *record.lastClean;
    std::size_t kept = 0;
    for (const auto& [key, object] : *record.lastClean)
      if (!parsed.contains(key)) ++kept;
    for (auto& [key, located] : parsed) effective.insert_or_assign(key, std::move(located.object));
    record.effective = std::make_shared<const ObjectMap>(std::move(effective));
    if (kept > 0)
      log::warning(
          "manifest file has errors; keeping its last good objects",
          {{"file", path}, {"failures", std::to_string(failures)}, {"kept", std::to_string(kept)}});
  }

  /// Reads a file's content. nullopt with `vanished` set when it no longer exists.
  std::optional<std::string> readFile(const fs::path& path, bool& vanished) {
    vanished = false;
    std::error_code ec;
    auto size = fs::file_size(path, ec);
    if (ec) {
      vanished = ec == std::errc::no_such_file_or_directory;
      if (!vanished)
        log::warning("cannot read manifest file",
                     {{"file", path.string()}, {"reason", ec.message()}});
      return std::nullopt;
    }
    if (size > kMaxFileBytes) {
      log::warning("manifest file too large; ignoring its new content",
                   {{"file", path.string()}, {"bytes", std::to_string(size)}});
      return std::nullopt;
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      int err = errno;
      vanished = err == ENOENT;
      if (!vanished)
        log::warning("cannot open manifest file",
                     {{"file", path.string()}, {"reason", std::strerror(err)}});
      return std::nullopt;
    }
    // Read straight into a string of the file's size: a stream buffer would grow by doubling
    // and copy the text once more. A file that grew since the stat is still read to its end.
    std::string content(static_cast<std::size_t>(size), '\0');
    in.read(content.data(), static_cast<std::streamsize>(content.size()));
    content.resize(static_cast<std::size_t>(in.gcount()));
    if (in && in.peek() != std::ifstream::traits_type::eof())
      content.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) {
      log::warning("cannot read manifest file",
                   {{"file", path.string()}, {"reason", "read error"}});
      return std::nullopt;
    }
    return content;
  }

  /// Re-reads the directory and delivers the difference to the sink.
  void rescan() {
    parsedBytes = 0;
    readAndDeliver();
    // Parsing a big file frees about as much as it keeps (the text, the decoded documents of
    // which only the changed objects stay); malloc keeps freed pages mapped unless asked, and
    // after the first sync nothing else asks before the next full sync, an hour away.
    if (parsedBytes >= kTrimAfterParsedBytes) malloc_trim(0);
    // Counted when done, so whoever sees the counter move also sees the deliveries.
    ++rescans;
  }

  void readAndDeliver() {
    std::error_code ec;
    std::vector<std::pair<std::string, ManifestFormat>> names;
    for (fs::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
      std::string name = it->path().filename().string();
      auto format = formatOf(name);
      if (!format.has_value()) continue;
      std::error_code typeEc;
      if (!fs::is_regular_file(it->path(), typeEc)) continue;  // follows symlinks
      names.emplace_back(std::move(name), *format);
    }
    if (ec) {
      // Without a listing we cannot tell removed files from unreadable ones: change nothing.
      ++fileReadFailures;
      if (!directoryUnreadable)
        log::error("cannot read manifest directory; keeping the current objects",
                   {{"directory", directory.string()}, {"reason", ec.message()}});
      directoryUnreadable = true;
      return;
    }
    directoryUnreadable = false;

    std::map<std::string, FileRecord> next;
    for (auto& [name, format] : names) {
      FileRecord record;
      if (auto old = files.find(name); old != files.end()) record = std::move(old->second);
      bool vanished = false;
      auto content = readFile(directory / name, vanished);
      if (!content.has_value()) {
        if (vanished) continue;  // removed since the listing: same as absent
        ++fileReadFailures;      // unreadable: keep what it held
        next.emplace(name, std::move(record));
        continue;
      }
      const ContentDigest digest = digestOf(*content);
      if (record.digest != digest) {
        parseFile(name, format, *content, digest, record);
        parsedBytes += content->size();
      }
      next.emplace(name, std::move(record));
    }
    files = std::move(next);

    ObjectMap desired;
    std::set<std::string> duplicates;
    for (const auto& [name, record] : files) {
      for (const auto& [key, object] : *record.effective) {
        auto [it, inserted] = desired.insert_or_assign(key, object);
        (void)it;
        if (!inserted) duplicates.insert(describe(key));
      }
    }
    for (const auto& object : duplicates) {
      if (!reportedDuplicates.contains(object))
        log::warning("object defined in several manifest files; the last file in name order wins",
                     {{"object", object}, {"directory", directory.string()}});
    }
    reportedDuplicates = std::move(duplicates);
    deliverDifference(desired);
    delivered = std::move(desired);
  }

  void deliverDifference(const ObjectMap& desired) {
    std::size_t upserts = 0, deletes = 0;
    for (const auto& [key, object] : delivered) {
      if (desired.contains(key)) continue;
      ++deletes;
      switch (key.kind) {
        case ObjectKind::kService:
          sink.serviceDeleted(key.ns, key.name);
          break;
        case ObjectKind::kEndpointSlice:
          sink.endpointSliceDeleted(key.ns, key.name);
          break;
        case ObjectKind::kNode:
          sink.nodeDeleted(key.name);
          break;
        case ObjectKind::kServiceCIDR:
          sink.serviceCIDRDeleted(key.name);
          break;
      }
    }
    for (const auto& [key, object] : desired) {
      auto old = delivered.find(key);
      if (old != delivered.end() && (old->second == object || *old->second == *object)) continue;
      ++upserts;
      // The sink shares the object (an aliasing pointer into the variant) rather than copying it.
      std::visit(
          [this, &object](const auto& value) {
            using T = std::decay_t<decltype(value)>;
            if constexpr (std::is_same_v<T, core::Service>)
              sink.sharedServiceUpserted(std::shared_ptr<const core::Service>(object, &value));
            else if constexpr (std::is_same_v<T, core::EndpointSlice>)
              sink.sharedEndpointSliceUpserted(
                  std::shared_ptr<const core::EndpointSlice>(object, &value));
            else if constexpr (std::is_same_v<T, core::Node>)
              sink.nodeUpserted(value);
            else if constexpr (std::is_same_v<T, core::ServiceCIDR>)
              sink.serviceCIDRUpserted(value);
          },
          *object);
    }
    if (upserts + deletes > 0)
      log::info(2, "applied manifest directory changes",
                {{"directory", directory.string()},
                 {"upserts", std::to_string(upserts)},
                 {"deletes", std::to_string(deletes)}});
  }

  /// Drains queued inotify events. Returns true when one of them may change what we read.
  bool drainEvents() {
    alignas(inotify_event) char buffer[16 * 1024];
    bool relevant = false;
    for (;;) {
      ssize_t n = ::read(inotifyFd, buffer, sizeof buffer);
      if (n <= 0) break;  // EAGAIN: drained
      for (char* p = buffer; p < buffer + n;) {
        auto* event = reinterpret_cast<inotify_event*>(p);
        p += sizeof(inotify_event) + event->len;
        if ((event->mask & IN_Q_OVERFLOW) != 0) {
          relevant = true;  // events were lost: re-read everything
        } else if ((event->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF)) != 0) {
          // Compare descriptors: a late IN_IGNORED for an old watch must not drop a new one.
          if (watchDescriptor >= 0 && event->wd == watchDescriptor) {
            log::warning("manifest directory was removed or moved; keeping the current objects",
                         {{"directory", directory.string()}});
            ::inotify_rm_watch(inotifyFd, watchDescriptor);
            watchDescriptor = -1;
          }
        } else if (relevantName(event->len > 0 ? std::string_view(event->name)
                                               : std::string_view())) {
          relevant = true;
        }
      }
    }
    return relevant;
  }

  void run() {
    std::optional<Clock::time_point> firstChange;
    Clock::time_point due{};
    for (;;) {
      int timeoutMs = -1;
      if (firstChange.has_value()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now());
        timeoutMs = static_cast<int>(std::max<std::chrono::milliseconds::rep>(0, left.count()));
      } else if (watchDescriptor < 0) {
        timeoutMs = kRewatchIntervalMs;
      }
      pollfd fds[2] = {{stopFd, POLLIN, 0}, {inotifyFd, POLLIN, 0}};
      int ready = ::poll(fds, 2, timeoutMs);
      if (ready < 0 && errno != EINTR) {
        log::error("manifest watcher poll failed; no further changes will be seen",
                   {{"directory", directory.string()}, {"reason", std::strerror(errno)}});
        return;
      }
      if ((fds[0].revents & POLLIN) != 0) return;
      const auto now = Clock::now();
      if ((fds[1].revents & POLLIN) != 0 && drainEvents()) {
        if (!firstChange.has_value()) firstChange = now;
        // Trailing debounce, bounded so a continuous stream of writes is still picked up.
        due =
            std::min(now + options.debounce, *firstChange + options.debounce * kMaxDebounceFactor);
      }
      if (watchDescriptor < 0 && !firstChange.has_value()) {
        if (addWatch()) {
          log::info(0, "watching manifest directory again", {{"directory", directory.string()}});
          firstChange = now;
          due = now;
        }
      }
      if (firstChange.has_value() && Clock::now() >= due) {
        firstChange.reset();
        rescan();
      }
    }
  }
};

ManifestSource::ManifestSource(std::filesystem::path directory, core::EventSink& sink,
                               ManifestSourceOptions options)
    : impl_(std::make_unique<Impl>(std::move(directory), sink, options)) {}

ManifestSource::~ManifestSource() { stop(); }

core::Result<void> ManifestSource::start() {
  Impl& d = *impl_;
  if (d.started)
    return core::makeError(core::ErrorCategory::kInternal, "manifest source already started");
  std::error_code ec;
  if (!fs::is_directory(d.directory, ec))
    return core::makeError(core::ErrorCategory::kNotFound,
                           fmt::format("manifest directory {} does not exist or is not a directory",
                                       d.directory.string()),
                           ec ? ec.value() : 0);
  d.started = true;
  // Watch before the first read, so a change racing with it is not missed.
  d.inotifyFd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (d.inotifyFd < 0)
    return core::makeError(core::ErrorCategory::kIo, "inotify_init1 for the manifest directory",
                           errno);
  if (!d.addWatch()) {
    int err = errno;
    d.closeFds();
    return core::makeError(core::ErrorCategory::kIo,
                           fmt::format("inotify_add_watch {}", d.directory.string()), err);
  }
  d.stopFd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d.stopFd < 0) {
    int err = errno;
    d.closeFds();
    return core::makeError(core::ErrorCategory::kIo, "eventfd for the manifest watcher", err);
  }

  d.rescan();
  log::info(1, "read manifest directory",
            {{"directory", d.directory.string()},
             {"files", std::to_string(d.files.size())},
             {"objects", std::to_string(d.delivered.size())}});
  d.sink.servicesSynced();
  d.sink.endpointSlicesSynced();
  d.thread = std::thread([&d] { d.run(); });
  return {};
}

void ManifestSource::stop() {
  Impl& d = *impl_;
  if (!d.thread.joinable()) return;
  std::uint64_t one = 1;
  // The eventfd counter cannot overflow with one write; a failure here would be a bug.
  [[maybe_unused]] ssize_t n = ::write(d.stopFd, &one, sizeof one);
  d.thread.join();
}

ManifestSourceStats ManifestSource::stats() const {
  return ManifestSourceStats{impl_->documentFailures.load(), impl_->fileReadFailures.load(),
                             impl_->rescans.load()};
}

}  // namespace kproxy::apiwatch
