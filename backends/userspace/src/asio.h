#pragma once
// Private: Boost.Asio for the userspace proxy. Debian's Boost 1.74 Asio uses std::exchange
// without including <utility> (kproxy/apiwatch/asio.h explains); this header includes it first
// and leaves out Beast and SSL, which the proxy does not use.

#include <utility>

#include <boost/asio.hpp>
