#pragma once
/// Small address checks shared by the flag parser, the config decoder and validation, over
/// net/'s types.

#include <optional>
#include <string_view>

#include "kproxy/net/host_port.h"
#include "kproxy/net/ip.h"

namespace kproxy::cli {

using net::HostPort;
using net::splitHostPort;

/// Which family `text` is as a plain IP literal (no brackets, no zone, no "/len"); nullopt when
/// it is none.
std::optional<net::Family> ipFamilyOf(std::string_view text);

/// True for "a.b.c.d/n" and "x::/n" with n in range (like Go's net.ParseCIDR).
bool isCIDR(std::string_view text);

}  // namespace kproxy::cli
