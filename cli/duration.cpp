#include "duration.h"

#include <cstdint>
#include <limits>

namespace kproxy::cli {
namespace {

using core::ErrorCategory;
using core::makeError;

constexpr std::uint64_t kNanosecond = 1;
constexpr std::uint64_t kMicrosecond = 1000 * kNanosecond;
constexpr std::uint64_t kMillisecond = 1000 * kMicrosecond;
constexpr std::uint64_t kSecond = 1000 * kMillisecond;
constexpr std::uint64_t kMinute = 60 * kSecond;
constexpr std::uint64_t kHour = 60 * kMinute;

// Longest unit names first so that "ms" is not read as "m" followed by "s".
struct Unit {
  std::string_view name;
  std::uint64_t nanos;
};
constexpr Unit kUnits[] = {
    {"ns", kNanosecond}, {"us", kMicrosecond}, {"\xC2\xB5s", kMicrosecond} /* U+00B5 */,
    {"\xCE\xBCs", kMicrosecond} /* U+03BC */, {"ms", kMillisecond}, {"s", kSecond},
    {"m", kMinute},      {"h", kHour},
};

bool isDigit(char c) { return c >= '0' && c <= '9'; }

// Appends `value / 10^precision` with the fraction's trailing zeros removed, as Go does.
void appendFraction(std::string& out, std::uint64_t value, int precision) {
  std::uint64_t scale = 1;
  for (int i = 0; i < precision; ++i) scale *= 10;
  out += std::to_string(value / scale);
  std::uint64_t frac = value % scale;
  if (frac == 0) return;
  std::string digits(static_cast<std::size_t>(precision), '0');
  for (int i = precision - 1; i >= 0; --i) {
    digits[static_cast<std::size_t>(i)] = static_cast<char>('0' + frac % 10);
    frac /= 10;
  }
  while (!digits.empty() && digits.back() == '0') digits.pop_back();
  out += '.';
  out += digits;
}

}  // namespace

core::Result<Duration> parseGoDuration(std::string_view text) {
  std::string_view s = text;
  bool negative = false;
  if (!s.empty() && (s.front() == '-' || s.front() == '+')) {
    negative = s.front() == '-';
    s.remove_prefix(1);
  }
  if (s == "0") return Duration{0};
  if (s.empty()) return makeError(ErrorCategory::kInvalidArgument, "empty duration");

  // Accumulate in unsigned nanoseconds with overflow checks; the limit allows the one extra
  // nanosecond that a negative int64 can hold.
  const std::uint64_t limit =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + (negative ? 1 : 0);
  std::uint64_t total = 0;
  auto overflow = [] { return makeError(ErrorCategory::kInvalidArgument, "duration out of range"); };

  while (!s.empty()) {
    // Integer part.
    std::uint64_t whole = 0;
    bool haveDigits = false;
    bool wholeOverflow = false;
    while (!s.empty() && isDigit(s.front())) {
      haveDigits = true;
      if (whole > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) wholeOverflow = true;
      if (!wholeOverflow) whole = whole * 10 + static_cast<std::uint64_t>(s.front() - '0');
      s.remove_prefix(1);
    }
    // Fraction: keep at most 19 significant digits, which is more than nanoseconds need.
    std::uint64_t frac = 0;
    std::uint64_t fracScale = 1;
    if (!s.empty() && s.front() == '.') {
      s.remove_prefix(1);
      while (!s.empty() && isDigit(s.front())) {
        haveDigits = true;
        if (fracScale < 1'000'000'000'000'000'000ULL) {
          frac = frac * 10 + static_cast<std::uint64_t>(s.front() - '0');
          fracScale *= 10;
        }
        s.remove_prefix(1);
      }
    }
    if (!haveDigits) return makeError(ErrorCategory::kInvalidArgument, "expected a number");
    if (s.empty() || isDigit(s.front()) || s.front() == '.') {
      return makeError(ErrorCategory::kInvalidArgument, "missing unit (one of ns, us, ms, s, m, h)");
    }
    const Unit* unit = nullptr;
    for (const Unit& candidate : kUnits) {
      if (s.starts_with(candidate.name) &&
          (unit == nullptr || candidate.name.size() > unit->name.size())) {
        unit = &candidate;
      }
    }
    if (unit == nullptr) {
      return makeError(ErrorCategory::kInvalidArgument, "unknown unit (one of ns, us, ms, s, m, h)");
    }
    s.remove_prefix(unit->name.size());

    if (wholeOverflow || (whole != 0 && whole > limit / unit->nanos)) return overflow();
    std::uint64_t value = whole * unit->nanos;
    if (frac != 0) {
      // frac/fracScale * unit, computed in long double: exact enough for <= 19 digits, and
      // truncated towards zero like Go.
      long double part = static_cast<long double>(frac) * static_cast<long double>(unit->nanos) /
                         static_cast<long double>(fracScale);
      value += static_cast<std::uint64_t>(part);
      if (value > limit) return overflow();
    }
    if (value > limit - total) return overflow();
    total += value;
  }
  if (negative) {
    if (total == limit) return Duration{std::numeric_limits<std::int64_t>::min()};
    return Duration{-static_cast<std::int64_t>(total)};
  }
  return Duration{static_cast<std::int64_t>(total)};
}

std::string formatGoDuration(Duration d) {
  const std::int64_t n = d.count();
  if (n == 0) return "0s";
  std::string out;
  std::uint64_t u = static_cast<std::uint64_t>(n);
  if (n < 0) {
    out += '-';
    u = 0 - u;  // two's complement magnitude, correct for INT64_MIN too
  }
  if (u < kSecond) {
    if (u < kMicrosecond) {
      out += std::to_string(u);
      out += "ns";
    } else if (u < kMillisecond) {
      appendFraction(out, u, 3);
      out += "\xC2\xB5s";
    } else {
      appendFraction(out, u, 6);
      out += "ms";
    }
    return out;
  }
  const std::uint64_t hours = u / kHour;
  const std::uint64_t minutes = (u / kMinute) % 60;
  const std::uint64_t secNanos = u % kMinute;
  if (hours > 0) out += std::to_string(hours) + "h";
  if (hours > 0 || minutes > 0) out += std::to_string(minutes) + "m";
  appendFraction(out, secNanos, 9);
  out += 's';
  return out;
}

}  // namespace kproxy::cli
