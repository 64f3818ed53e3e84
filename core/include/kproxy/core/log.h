#pragma once
/// Structured, levelled logging: one line per event, `key=value` pairs after a short message.
///   I1121 23:40:00.123456 sync.cpp] "synced rules" kind=partial changed=3 duration=1.2ms
/// Verbosity follows klog's -v: info lines with v <= the configured level are written.
/// Thread-safe. Output goes to stderr unless a sink is installed: a program embedding the core
/// routes the events to its own logging with a LogSink (setLogSink), tests capture formatted
/// lines with a Sink (setSink).

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace kproxy::log {

enum class Severity { kInfo, kWarning, kError };

using Field = std::pair<std::string_view, std::string>;

/// One log event before it is formatted. Everything it refers to lives only for the duration
/// of the LogSink::write call that receives it: copy what you keep.
struct Record {
  Severity severity = Severity::kInfo;
  std::chrono::system_clock::time_point time;
  std::string_view message;
  std::span<const Field> fields;  ///< in the order the caller gave them
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

/// The klog-style line kproxy writes to stderr by default, without the trailing newline
/// ("I1121 23:40:00.123456 kproxy] \"msg\" key=value"), for a sink that wants the same text.
std::string formatLine(const Record& record);

/// Installs `sink` for every thread (nullptr restores the default: formatLine + '\n' on
/// stderr). Returns the sink it replaced (nullptr for the default), to be restored later.
std::shared_ptr<LogSink> setLogSink(std::shared_ptr<LogSink> sink);

/// A sink of formatted lines (formatLine, no newline): the short form of a LogSink for tests.
using Sink = std::function<void(Severity, std::string_view line)>;

/// Installs a line sink (nullptr restores stderr). Returns the previous output as a Sink;
/// installing that again restores it, also when it was a LogSink set with setLogSink.
Sink setSink(Sink sink);

void setVerbosity(int v);
int verbosity();
inline bool enabled(int v) { return v <= verbosity(); }

void write(Severity severity, std::string_view message, std::initializer_list<Field> fields);

inline void info(int v, std::string_view message, std::initializer_list<Field> fields = {}) {
  if (enabled(v)) write(Severity::kInfo, message, fields);
}
inline void warning(std::string_view message, std::initializer_list<Field> fields = {}) {
  write(Severity::kWarning, message, fields);
}
inline void error(std::string_view message, std::initializer_list<Field> fields = {}) {
  write(Severity::kError, message, fields);
}

}  // namespace kproxy::log
