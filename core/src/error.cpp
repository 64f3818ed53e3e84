#include "kproxy/core/error.h"

#include <cstring>

namespace kproxy::core {

const char* toString(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::kInvalidArgument: return "invalid argument";
    case ErrorCategory::kNotFound: return "not found";
    case ErrorCategory::kKernel: return "kernel";
    case ErrorCategory::kTransient: return "transient";
    case ErrorCategory::kProcess: return "process";
    case ErrorCategory::kIo: return "io";
    case ErrorCategory::kDecode: return "decode";
    case ErrorCategory::kPlugin: return "plugin";
    case ErrorCategory::kInternal: return "internal";
  }
  return "unknown";
}

std::string Error::message() const {
  std::string out = context;
  if (errnum != 0) {
    // Once: a context that already ends with the reason (a plugin's message, which the host
    // wraps with its errno) does not get it twice.
    const std::string reason = std::string(": ") + std::strerror(errnum);
    if (!out.ends_with(reason)) out += reason;
  }
  return out;
}

}  // namespace kproxy::core
