#pragma once
/// Structured, levelled logging: one line per event, `key="value"` pairs after a short message,
/// in the two formats kube-proxy writes:
///   text (klog's header, InfoS's pairs):
///     I1121 23:40:00.123456   12345 proxier.cpp:214] "Synced rules" kind="partial" changed=3
///   json (component-base's JSON logger):
///     {"ts":1700000000123.456,"caller":"src/proxier.cpp:214","msg":"Synced rules","v":2,"kind":"partial","changed":3}
/// Verbosity follows klog's -v and --vmodule: an info line of level v is written when v <= the
/// global level, or v <= the level of the first --vmodule pattern that matches its source file.
/// Thread-safe. Output goes to stderr unless a sink is installed: a program embedding the core
/// routes the events to its own logging with a LogSink (setLogSink), tests capture formatted
/// lines with a Sink (setSink).

#include <chrono>
#include <expected>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kproxy::log {

enum class Severity { kInfo, kWarning, kError };

/// A value is written as klog writes a Go value: one that reads as a number or a boolean
/// bare (text) or as a JSON number or boolean (json), anything else as a quoted string.
using Field = std::pair<std::string_view, std::string>;

/// One log event before it is formatted. Everything it refers to lives only for the duration
/// of the LogSink::write call that receives it: copy what you keep.
struct Record {
  Severity severity = Severity::kInfo;
  std::chrono::system_clock::time_point time;
  std::string_view message;
  std::span<const Field> fields;  ///< in the order the caller gave them
  std::string_view file;          ///< the caller's source file as compiled (may be empty)
  int line = 0;                   ///< the caller's line (0: unknown)
  int verbosity = 0;              ///< an info event's -v level (0 for warnings and errors)
  long threadId = 0;              ///< the writing thread's kernel id (gettid)
};

/// Where log events go, for an embedder that has logging of its own (journald, spdlog, its
/// own JSON lines). Thread-safety: the logger calls write() under its lock, so calls never
/// overlap and a sink needs no lock for itself; in exchange write() must not log through
/// kproxy::log (that would deadlock) and should return quickly (every thread logging waits).
class LogSink {
 public:
  virtual ~LogSink() = default;
  virtual void write(const Record& record) = 0;
};

enum class Format {
  kText,  ///< klog's text lines (the default)
  kJson,  ///< component-base's JSON records
};

/// The format of the default output and of line sinks (setSink). Any thread, any time.
void setFormat(Format format);
Format format();

/// klog's line, without the trailing newline:
/// `Lmmdd hh:mm:ss.uuuuuu THREADID file:line] "msg" key="value" n=1` (local time; the file's
/// base name; an error's or warning's letter E or W).
std::string formatLine(const Record& record);

/// component-base's JSON record, without the trailing newline:
/// {"ts":<ms since the epoch>,"caller":"<dir>/<file>:<line>","msg":…,"v":N,<fields>}; errors
/// carry no "v", as upstream's.
std::string formatJson(const Record& record);

/// formatLine or formatJson, as setFormat chose.
std::string formatRecord(const Record& record);

/// Installs `sink` for every thread (nullptr restores the default: formatRecord + '\n' on
/// stderr). Returns the sink it replaced (nullptr for the default), to be restored later.
std::shared_ptr<LogSink> setLogSink(std::shared_ptr<LogSink> sink);

/// A sink of formatted lines (formatRecord, no newline): the short form of a LogSink for tests.
using Sink = std::function<void(Severity, std::string_view line)>;

/// Installs a line sink (nullptr restores stderr). Returns the previous output as a Sink;
/// installing that again restores it, also when it was a LogSink set with setLogSink.
Sink setSink(Sink sink);

/// The global level (-v). Any thread, any time: a change applies to the next line.
void setVerbosity(int v);
int verbosity();

/// Replaces the --vmodule patterns: "pattern=N" items, where the pattern is a glob (`*`, `?`,
/// `[...]`) matched against the source file's base name without its extension
/// ("proxier=4", "kernel_*=5"), or, when it holds a '/', against its path without the
/// extension ("backends/nftables/*=4"). The first matching item decides, as klog's. An
/// empty list clears them. A malformed item is refused and nothing changes.
std::expected<void, std::string> setVmodule(const std::vector<std::string>& items);

/// The level that applies to lines written from `file`: the global one, or higher where a
/// --vmodule pattern names the file.
int verbosityFor(std::string_view file);

inline bool enabled(int v, std::source_location where = std::source_location::current()) {
  return v <= verbosity() || v <= verbosityFor(where.file_name());
}

/// Writes one event as if from `file`:`line` (a plugin's lines come through here). Info
/// events are filtered here against `verbosity` and the file's --vmodule level.
void writeAt(Severity severity, int verbosity, std::string_view file, int line,
             std::string_view message, std::span<const Field> fields);

inline void write(Severity severity, std::string_view message, std::initializer_list<Field> fields,
                  std::source_location where = std::source_location::current()) {
  writeAt(severity, 0, where.file_name(), static_cast<int>(where.line()), message,
          std::span<const Field>(fields.begin(), fields.size()));
}

inline void info(int v, std::string_view message, std::initializer_list<Field> fields = {},
                 std::source_location where = std::source_location::current()) {
  writeAt(Severity::kInfo, v, where.file_name(), static_cast<int>(where.line()), message,
          std::span<const Field>(fields.begin(), fields.size()));
}
inline void warning(std::string_view message, std::initializer_list<Field> fields = {},
                    std::source_location where = std::source_location::current()) {
  writeAt(Severity::kWarning, 0, where.file_name(), static_cast<int>(where.line()), message,
          std::span<const Field>(fields.begin(), fields.size()));
}
inline void error(std::string_view message, std::initializer_list<Field> fields = {},
                  std::source_location where = std::source_location::current()) {
  writeAt(Severity::kError, 0, where.file_name(), static_cast<int>(where.line()), message,
          std::span<const Field>(fields.begin(), fields.size()));
}

}  // namespace kproxy::log
