#pragma once
/// Structured, levelled logging: one line per event, `key=value` pairs after a short message.
///   I1121 23:40:00.123456 sync.cpp] "synced rules" kind=partial changed=3 duration=1.2ms
/// Verbosity follows klog's -v: info lines with v <= the configured level are written.
/// Thread-safe. Output goes to stderr unless a sink is installed (tests capture it).

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace kproxy::log {

enum class Severity { kInfo, kWarning, kError };

using Field = std::pair<std::string_view, std::string>;
using Sink = std::function<void(Severity, std::string_view line)>;

void setVerbosity(int v);
int verbosity();
inline bool enabled(int v) { return v <= verbosity(); }

/// Replaces the output (nullptr restores stderr). Returns the previous sink.
Sink setSink(Sink sink);

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
