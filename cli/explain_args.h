#pragma once
/// The command line of `kproxy explain SRC DST:PORT[/tcp|udp|sctp] [--from-node] [--iif NAME]
/// [--json] [kproxy flags...]`: the packet, and the remaining words for parseFlags().

#include <span>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/plugins/loader.h"

namespace kproxy::cli {

struct ExplainCommand {
  plugins::ExplainRequest request;
  bool showHelp = false;
  /// Every other word, in order, for parseFlags().
  std::vector<const char*> flags;
};

/// Parses the words after "explain". SRC and DST are numeric addresses of one family; an IPv6
/// destination is written "[fd00::1]:80"; the protocol defaults to tcp. Errors are one line
/// naming the bad word.
core::Result<ExplainCommand> parseExplainCommand(std::span<const char* const> args);

/// The usage text of `kproxy explain`.
std::string explainUsage();

}  // namespace kproxy::cli
