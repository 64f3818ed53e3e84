#include "kproxy/core/log.h"

#include <fnmatch.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <unordered_map>

namespace kproxy::log {
namespace {

std::atomic<int> gVerbosity{0};
std::atomic<Format> gFormat{Format::kText};

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
  void write(const Record& record) override { sink_(record.severity, formatRecord(record)); }
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
    Record record;
    record.severity = severity;
    record.time = std::chrono::system_clock::now();
    record.message = line;
    sink->write(record);
  }
};

// --- vmodule (klog's semantics: the first matching pattern decides; a file's answer is
// cached by the address of its name, which source_location and plugins keep for the process) ---

struct VmoduleItem {
  std::string pattern;
  bool fullPath = false;  // the pattern holds a '/': match the path, not the base name
  int level = 0;
};

struct Vmodule {
  std::mutex mutex;
  std::vector<VmoduleItem> items;
  std::unordered_map<std::string, int> levelByFile;  // keyed by the file as compiled
};

Vmodule& vmodule() {
  static Vmodule v;
  return v;
}

std::atomic<bool> gHaveVmodule{false};

// The path without the build's leading "./" and "../" (ccache's base directory makes paths
// relative to the build directory).
std::string_view sourcePath(std::string_view file) {
  for (;;) {
    if (file.starts_with("./")) {
      file.remove_prefix(2);
    } else if (file.starts_with("../")) {
      file.remove_prefix(3);
    } else {
      return file;
    }
  }
}

std::string_view baseName(std::string_view file) {
  const auto slash = file.rfind('/');
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}

std::string_view withoutExtension(std::string_view file) {
  const auto dot = file.rfind('.');
  const auto slash = file.rfind('/');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash)) return file;
  return file.substr(0, dot);
}

// zap's ShortCallerEncoder: the last directory and the file name.
std::string_view shortCaller(std::string_view file) {
  file = sourcePath(file);
  const auto slash = file.rfind('/');
  if (slash == std::string_view::npos || slash == 0) return file;
  const auto previous = file.rfind('/', slash - 1);
  return previous == std::string_view::npos ? file : file.substr(previous + 1);
}

int vmoduleLevel(std::string_view file) {
  Vmodule& v = vmodule();
  std::lock_guard lock(v.mutex);
  std::string key(file);
  if (auto it = v.levelByFile.find(key); it != v.levelByFile.end()) return it->second;
  const std::string full(withoutExtension(sourcePath(file)));
  const std::string base(withoutExtension(baseName(file)));
  int level = 0;
  for (const auto& item : v.items) {
    const std::string& subject = item.fullPath ? full : base;
    if (fnmatch(item.pattern.c_str(), subject.c_str(), FNM_PATHNAME) == 0) {
      level = item.level;
      break;
    }
  }
  v.levelByFile.emplace(std::move(key), level);
  return level;
}

long currentThreadId() {
  thread_local const long id = static_cast<long>(::syscall(SYS_gettid));
  return id;
}

char severityLetter(Severity severity) {
  switch (severity) {
    case Severity::kInfo: return 'I';
    case Severity::kWarning: return 'W';
    case Severity::kError: return 'E';
  }
  return 'I';
}

// Whether a value reads as a Go number (an integer or a decimal, as strconv formats them) or
// a boolean, which klog writes bare and the JSON logger as a JSON number or boolean.
bool isBareValue(std::string_view value) {
  if (value == "true" || value == "false") return true;
  std::size_t i = 0;
  if (i < value.size() && value[i] == '-') ++i;
  const std::size_t intStart = i;
  while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
  const std::size_t intDigits = i - intStart;
  if (intDigits == 0) return false;
  if (intDigits > 1 && value[intStart] == '0') return false;  // JSON has no leading zeros
  if (i < value.size() && value[i] == '.') {
    ++i;
    const std::size_t fracStart = i;
    while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
    if (i == fracStart) return false;
  }
  if (i < value.size() && (value[i] == 'e' || value[i] == 'E')) {
    ++i;
    if (i < value.size() && (value[i] == '+' || value[i] == '-')) ++i;
    const std::size_t expStart = i;
    while (i < value.size() && value[i] >= '0' && value[i] <= '9') ++i;
    if (i == expStart) return false;
  }
  return i == value.size();
}

enum class Quoting { kGo, kJson };

// A quoted string with the escapes both log formats share (quote, backslash, \n, \r, \t); the
// other control bytes as Go's \xNN (DEL too) or JSON's \u00NN.
void appendQuoted(std::string& out, std::string_view value, Quoting quoting) {
  out += '"';
  for (char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || (quoting == Quoting::kGo && c == 0x7f)) {
          char buf[8];
          if (quoting == Quoting::kGo)
            std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
          else
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// strconv.Quote's escapes for what logs carry (klog's text values): quote, backslash, the
// usual control letters and \xNN for the other control bytes and DEL.
void appendGoQuoted(std::string& out, std::string_view value) { appendQuoted(out, value, Quoting::kGo); }

// A JSON string as zap's encoder writes one: \u00NN for the other control bytes.
void appendJsonString(std::string& out, std::string_view value) { appendQuoted(out, value, Quoting::kJson); }

void appendHeader(std::string& out, const Record& record) {
  using namespace std::chrono;
  const std::time_t seconds = system_clock::to_time_t(record.time);
  auto micros = duration_cast<microseconds>(record.time.time_since_epoch()).count() % 1000000;
  if (micros < 0) micros += 1000000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char buf[64];
  // klog pads the thread id to seven columns.
  std::snprintf(buf, sizeof buf, "%c%02d%02d %02d:%02d:%02d.%06lld %7ld ",
                severityLetter(record.severity), local.tm_mon + 1, local.tm_mday, local.tm_hour,
                local.tm_min, local.tm_sec, static_cast<long long>(micros), record.threadId);
  out += buf;
  const std::string_view file = record.file.empty() ? std::string_view("???") : baseName(record.file);
  out += file;
  out += ':';
  out += std::to_string(record.line);
  out += "] ";
}

}  // namespace

std::string formatLine(const Record& record) {
  std::string line;
  line.reserve(112 + record.message.size());
  appendHeader(line, record);
  appendGoQuoted(line, record.message);
  for (const auto& [key, value] : record.fields) {
    line += ' ';
    line += key;
    line += '=';
    if (isBareValue(value)) {
      line += value;
    } else {
      appendGoQuoted(line, value);
    }
  }
  return line;
}

std::string formatJson(const Record& record) {
  std::string out;
  out.reserve(112 + record.message.size());
  // zap's epochMillisTimeEncoder: milliseconds since the epoch as a float64, written in the
  // shortest form that reads back the same, never with an exponent.
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(record.time.time_since_epoch()).count();
  const double millis = static_cast<double>(nanos) / 1e6;
  char ts[64];
  const auto [end, ec] = std::to_chars(ts, ts + sizeof ts, millis, std::chars_format::fixed);
  out += R"({"ts":)";
  out.append(ts, ec == std::errc{} ? end : ts);
  out += R"(,"caller":)";
  std::string caller(record.file.empty() ? std::string_view("???") : shortCaller(record.file));
  caller += ':';
  caller += std::to_string(record.line);
  appendJsonString(out, caller);
  out += R"(,"msg":)";
  appendJsonString(out, record.message);
  // zapr writes "v" on info records (klog's warnings are info records at v=0), not on errors.
  if (record.severity != Severity::kError) {
    out += R"(,"v":)";
    out += std::to_string(record.verbosity);
  }
  for (const auto& [key, value] : record.fields) {
    out += ',';
    appendJsonString(out, key);
    out += ':';
    if (isBareValue(value)) {
      out += value;
    } else {
      appendJsonString(out, value);
    }
  }
  out += '}';
  return out;
}

std::string formatRecord(const Record& record) {
  return format() == Format::kJson ? formatJson(record) : formatLine(record);
}

void setFormat(Format f) { gFormat.store(f, std::memory_order_relaxed); }
Format format() { return gFormat.load(std::memory_order_relaxed); }

void setVerbosity(int v) { gVerbosity.store(v, std::memory_order_relaxed); }

int verbosity() { return gVerbosity.load(std::memory_order_relaxed); }

std::expected<void, std::string> setVmodule(const std::vector<std::string>& items) {
  std::vector<VmoduleItem> parsed;
  for (const auto& item : items) {
    const auto eq = item.rfind('=');
    if (eq == std::string::npos || eq == 0) {
      return std::unexpected("vmodule item \"" + item + "\": expected pattern=N");
    }
    int level = 0;
    const char* first = item.data() + eq + 1;
    const char* last = item.data() + item.size();
    const auto [ptr, ec] = std::from_chars(first, last, level);
    if (ec != std::errc{} || ptr != last || first == last || level < 0) {
      return std::unexpected("vmodule item \"" + item + "\": the level must be a non-negative integer");
    }
    std::string_view pattern = std::string_view(item).substr(0, eq);
    const bool full = pattern.find('/') != std::string_view::npos;
    // klog matches the file without ".go"; kproxy's files end in .cpp or .h.
    for (const std::string_view ext : {".cpp", ".cc", ".h", ".go"}) {
      if (pattern.ends_with(ext)) {
        pattern.remove_suffix(ext.size());
        break;
      }
    }
    parsed.push_back({std::string(pattern), full, level});
  }
  Vmodule& v = vmodule();
  std::lock_guard lock(v.mutex);
  v.items = std::move(parsed);
  v.levelByFile.clear();
  gHaveVmodule.store(!v.items.empty(), std::memory_order_release);
  return {};
}

int verbosityFor(std::string_view file) {
  const int global = verbosity();
  if (!gHaveVmodule.load(std::memory_order_acquire)) return global;
  const int level = vmoduleLevel(file);
  return level > global ? level : global;
}

void writeAt(Severity severity, int v, std::string_view file, int line, std::string_view message,
             std::span<const Field> fields) {
  if (severity == Severity::kInfo && v > verbosity() && v > verbosityFor(file)) return;
  Record record;
  record.severity = severity;
  record.time = std::chrono::system_clock::now();
  record.message = message;
  record.fields = fields;
  record.file = file;
  record.line = line;
  record.verbosity = severity == Severity::kInfo ? v : 0;
  record.threadId = currentThreadId();
  std::lock_guard lock(sinkMutex());
  if (currentSink()) {
    currentSink()->write(record);
    return;
  }
  std::string text = formatRecord(record);
  text += '\n';
  std::fwrite(text.data(), 1, text.size(), stderr);
}

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

}  // namespace kproxy::log
