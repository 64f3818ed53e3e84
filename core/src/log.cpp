#include "kproxy/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace kproxy::log {
namespace {

std::atomic<int> gVerbosity{0};

// One mutex serialises formatting-free output and sink replacement, so lines never interleave.
std::mutex& sinkMutex() {
  static std::mutex m;
  return m;
}

Sink& currentSink() {
  static Sink sink;
  return sink;
}

char severityLetter(Severity severity) {
  switch (severity) {
    case Severity::kInfo: return 'I';
    case Severity::kWarning: return 'W';
    case Severity::kError: return 'E';
  }
  return 'I';
}

bool needsQuoting(std::string_view value) {
  if (value.empty()) return true;
  for (char c : value) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || c == '\t' || c == '\n' || c == '\r') {
      return true;
    }
  }
  return false;
}

void appendQuoted(std::string& out, std::string_view value) {
  out += '"';
  for (char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  out += '"';
}

void appendHeader(std::string& out, Severity severity) {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t seconds = system_clock::to_time_t(now);
  const auto micros = duration_cast<microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%c%02d%02d %02d:%02d:%02d.%06lld kproxy] ",
                severityLetter(severity), local.tm_mon + 1, local.tm_mday, local.tm_hour,
                local.tm_min, local.tm_sec, static_cast<long long>(micros));
  out += buf;
}

}  // namespace

void setVerbosity(int v) { gVerbosity.store(v, std::memory_order_relaxed); }

int verbosity() { return gVerbosity.load(std::memory_order_relaxed); }

Sink setSink(Sink sink) {
  std::lock_guard lock(sinkMutex());
  Sink previous = std::move(currentSink());
  currentSink() = std::move(sink);
  return previous;
}

void write(Severity severity, std::string_view message, std::initializer_list<Field> fields) {
  std::string line;
  line.reserve(96 + message.size());
  appendHeader(line, severity);
  appendQuoted(line, message);
  for (const auto& [key, value] : fields) {
    line += ' ';
    line += key;
    line += '=';
    if (needsQuoting(value)) {
      appendQuoted(line, value);
    } else {
      line += value;
    }
  }

  std::lock_guard lock(sinkMutex());
  if (currentSink()) {
    currentSink()(severity, line);
    return;
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace kproxy::log
