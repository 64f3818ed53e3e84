#pragma once
/// A source of Services, EndpointSlices, Nodes and ServiceCIDRs read from a directory of manifests instead of
/// an API server (`kproxy --manifests DIR`): the embedded default for demos and air-gapped use.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>

#include "kproxy/core/error.h"
#include "kproxy/core/events.h"

namespace kproxy::apiwatch {

struct ManifestSourceOptions {
  /// Quiet time after the last change before the directory is re-read. Bursts (an editor's
  /// save, `cp -r`) become one re-read; a continuous stream is still re-read at least every
  /// 5 × debounce.
  std::chrono::milliseconds debounce{100};
};

/// Counters for metrics. Each failure is counted once, when the file content that causes it
/// is first read, not on every re-read of an unchanged file.
struct ManifestSourceStats {
  std::uint64_t documentFailures = 0;  ///< documents or list items that could not be decoded
  std::uint64_t fileReadFailures = 0;  ///< files (or the directory) that could not be read
  std::uint64_t rescans =
      0;  ///< completed reads of the directory (deliveries done), incl. the first
};

/// Reads every `*.yaml`, `*.yml` and `*.json` file directly in a directory (not recursive;
/// hidden files and editor leftovers are ignored; symlinks are followed, so a mounted
/// ConfigMap works). Files may hold several YAML documents separated by `---` and List
/// objects (`kind: List`, `ServiceList`, ...). Objects of other kinds are skipped.
///
/// Delivery: start() delivers every object as an upsert, then servicesSynced() and
/// endpointSlicesSynced(). Afterwards an inotify watch re-reads the directory shortly after
/// any change and delivers only the difference (upserts for new or changed objects, deletes
/// for vanished ones), keyed by kind/namespace/name.
///
/// Bad input never loses state: a document that cannot be parsed or decoded is skipped with a
/// warning naming the file, document and reason; objects that a file delivered while it was
/// last fully valid are kept (not deleted) while the file has errors. Removing a file deletes
/// its objects. When two documents define the same object, the later one wins (files in name
/// order, documents in file order) and a warning names both places.
///
/// Thread-safety: start() and stop() are called from one thread. The sink is called from the
/// thread calling start() during start(), and from the source's own thread afterwards, never
/// concurrently. stats() may be called from any thread.
class ManifestSource {
 public:
  ManifestSource(std::filesystem::path directory, core::EventSink& sink,
                 ManifestSourceOptions options = {});
  /// Stops the watcher thread (see stop()).
  ~ManifestSource();
  ManifestSource(const ManifestSource&) = delete;
  ManifestSource& operator=(const ManifestSource&) = delete;

  /// Performs the initial read and starts watching. Fails (kNotFound) when the directory does
  /// not exist or is not a directory, (kIo) when inotify cannot be set up, and (kInternal)
  /// when called a second time. Bad files are not a failure: they are logged and skipped.
  core::Result<void> start();

  /// Stops watching and joins the thread; no sink call happens after it returns. Idempotent.
  void stop();

  ManifestSourceStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::apiwatch
