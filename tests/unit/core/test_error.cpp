// core::Error::message(): the context, then the errno's text once.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>
#include <string>

#include "kproxy/core/error.h"

using kproxy::core::Error;
using kproxy::core::ErrorCategory;

TEST_CASE("an error's message is its context and its errno's text, once", "[unit]") {
  CHECK(Error{ErrorCategory::kKernel, 0, "opening x"}.message() == "opening x");
  CHECK(Error{ErrorCategory::kKernel, EMFILE, "opening x"}.message() ==
        std::string("opening x: ") + std::strerror(EMFILE));
  // A context that carries the reason already (a plugin's message, wrapped by the host with
  // the plugin's errno) does not get it twice.
  const std::string wrapped = std::string("userspace: listener: ") + std::strerror(EMFILE);
  CHECK(Error{ErrorCategory::kKernel, EMFILE, wrapped}.message() == wrapped);
  // Another errno's text is not the reason.
  CHECK(Error{ErrorCategory::kKernel, ENOENT, wrapped}.message() == wrapped + ": " + std::strerror(ENOENT));
}
