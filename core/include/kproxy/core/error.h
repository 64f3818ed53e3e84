#pragma once
/// Errors from the environment (kernel, processes, files, HTTP, decoding) travel as values:
/// std::expected<T, kproxy::core::Error>. Exceptions never cross a module or plugin boundary.

#include <expected>
#include <string>
#include <utility>

namespace kproxy::core {

enum class ErrorCategory {
  kInvalidArgument,  ///< bad flag, config value or API object
  kNotFound,         ///< missing file, plugin, object
  kKernel,           ///< a netlink / kernel call failed
  kTransient,        ///< busy, interrupted, out of buffers: a retry may well succeed
  kProcess,          ///< a child process failed
  kIo,               ///< file or socket I/O
  kDecode,           ///< JSON / YAML could not be decoded
  kPlugin,           ///< plugin loading or ABI problem
  kInternal,         ///< an invariant did not hold
};

const char* toString(ErrorCategory category);

/// What went wrong, where, and the errno (0 when none applies).
struct Error {
  ErrorCategory category = ErrorCategory::kInternal;
  int errnum = 0;
  std::string context;  ///< human-readable, names the object / file / call

  /// One line: "<context>[: <strerror(errnum)>]", the errno's text left out where the context
  /// ends with it already.
  std::string message() const;
};

inline std::unexpected<Error> makeError(ErrorCategory category, std::string context, int errnum = 0) {
  return std::unexpected(Error{category, errnum, std::move(context)});
}

template <typename T>
using Result = std::expected<T, Error>;

}  // namespace kproxy::core
