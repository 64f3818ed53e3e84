#include "kproxy/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace kproxy::log {
namespace {

std::atomic<int> gVerbosity{0};

// One mutex serialises sink calls, stderr writes and sink replacement, so lines never
// interleave and a sink is never called after setLogSink replaced it.
std::mutex& sinkMutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<LogSink>& currentSink() {
  static std::shared_ptr<LogSink> sink;
  return sink;
}

// A Sink of formatted lines behind the LogSink interface (setSink).
class LineSink final : public LogSink {
 public:
  explicit LineSink(Sink sink) : sink_(std::move(sink)) {}
  void write(const Record& record) override { sink_(record.severity, formatLine(record)); }
  const Sink& sink() const { return sink_; }

 private:
  Sink sink_;
};

// What setSink returns for a LogSink that is not a LineSink: it still forwards formatted lines
// when called directly, and setSink recognises it to put the LogSink itself back.
struct ForwardToLogSink {
  std::shared_ptr<LogSink> sink;
  void operator()(Severity severity, std::string_view line) const {
    // The line is already formatted: hand it over as the message of a record.
    sink->write(Record{severity, std::chrono::system_clock::now(), line, {}});
  }
};

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

void appendHeader(std::string& out, Severity severity, std::chrono::system_clock::time_point now) {
  using namespace std::chrono;
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

std::string formatLine(const Record& record) {
  std::string line;
  line.reserve(96 + record.message.size());
  appendHeader(line, record.severity, record.time);
  appendQuoted(line, record.message);
  for (const auto& [key, value] : record.fields) {
    line += ' ';
    line += key;
    line += '=';
    if (needsQuoting(value)) {
      appendQuoted(line, value);
    } else {
      line += value;
    }
  }
  return line;
}

void setVerbosity(int v) { gVerbosity.store(v, std::memory_order_relaxed); }

int verbosity() { return gVerbosity.load(std::memory_order_relaxed); }

std::shared_ptr<LogSink> setLogSink(std::shared_ptr<LogSink> sink) {
  std::lock_guard lock(sinkMutex());
  return std::exchange(currentSink(), std::move(sink));
}

Sink setSink(Sink sink) {
  std::shared_ptr<LogSink> next;
  if (const auto* forward = sink.target<ForwardToLogSink>()) {
    next = forward->sink;
  } else if (sink) {
    next = std::make_shared<LineSink>(std::move(sink));
  }
  std::shared_ptr<LogSink> previous = setLogSink(std::move(next));
  if (!previous) return nullptr;
  if (const auto* lines = dynamic_cast<const LineSink*>(previous.get())) return lines->sink();
  return ForwardToLogSink{std::move(previous)};
}

void write(Severity severity, std::string_view message, std::initializer_list<Field> fields) {
  const Record record{severity, std::chrono::system_clock::now(), message,
                      std::span<const Field>(fields.begin(), fields.size())};
  std::lock_guard lock(sinkMutex());
  if (currentSink()) {
    currentSink()->write(record);
    return;
  }
  std::string line = formatLine(record);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace kproxy::log
