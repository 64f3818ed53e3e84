#pragma once
/// `kproxy status`: asks a running kproxy's metrics server for /debug/services and prints it.
///
///   kproxy status [--server HOST:PORT] [-o table|wide|json] [NAMESPACE/SERVICE]
///
/// The server defaults to kube-proxy's metrics address, 127.0.0.1:10249 (a 0.0.0.0 or ::
/// host means this host's loopback).

#include <span>

namespace kproxy::cli {

/// Runs the command with the arguments after "status"; returns the process exit status (0 ok,
/// 1 the server could not be asked, 2 bad arguments).
int statusCommand(std::span<const char* const> args);

}  // namespace kproxy::cli
