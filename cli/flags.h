#pragma once
/// kproxy's command line: kube-proxy's flag names (pflag syntax) plus kproxy's own, and the
/// precedence between flags and a --config file.
///
/// Syntax accepted, as pflag does: `--flag=value`, `--flag value`, bool flags as `--flag` or
/// `--flag=true|false` (not `--flag false`), `-v N`, `-v=N`, `-vN`, `--v=N`, `-h`. A flag given
/// twice keeps the last value, except the list flags (--nodeport-addresses,
/// --ipvs-exclude-cidrs, --plugin-dir, --feature-gates, --vmodule), which accumulate. As
/// upstream's flag set (WordSepNormalizeFunc), `_` in a flag's name is read as `-`
/// (`--iptables_sync_period` is `--iptables-sync-period`).
///
/// Every flag upstream kube-proxy v1.34 registers is accepted (the list the program test checks:
/// tests/program/data/upstream-flags-1.34.txt); the deprecated ones (--healthz-port,
/// --metrics-port) with pflag's warning.

#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"
#include "proxy_config.h"
#include "validation.h"  // validate(), so that the program needs this header and config_file.h only

namespace kproxy::cli {

/// The command line as parsed, before any --config file is read.
struct ParsedFlags {
  /// Defaults overridden by every flag given. Flags that map to KubeProxyConfiguration fields
  /// land in their field; process flags (--master, --manifests, ...) in theirs.
  ProxyConfig config;
  std::string configFile;     ///< --config
  std::string writeConfigTo;  ///< --write-config-to
  /// Names (without dashes, long form: "v", "proxy-mode", ...) of the flags given explicitly.
  std::set<std::string> explicitlySet;
  /// What pflag prints while parsing, one line each, for the caller to print to stderr:
  /// `Flag --healthz-port has been deprecated, ...`.
  std::vector<std::string> warnings;
  /// The deprecated --healthz-port and --metrics-port (upstream's defaults), and the bind
  /// address flags as given (before a port is appended), which effectiveConfig() combines as
  /// upstream's addressFromDeprecatedFlags does.
  std::int32_t healthzPort = kProxyHealthzPort;
  std::int32_t metricsPort = kProxyMetricsPort;
  std::string healthzBindAddressGiven;
  std::string metricsBindAddressGiven;

  bool isSet(std::string_view name) const { return explicitlySet.contains(std::string(name)); }
};

/// Parses the arguments after the program name (argv[1..argc-1]). Errors are one line:
/// `unknown flag: --foo`, `flag needs an argument: --config`,
/// `invalid value "3x" for flag --iptables-sync-period: ...`, `unexpected argument "foo"`.
core::Result<ParsedFlags> parseFlags(std::span<const char* const> args);

/// Whether the command-line word `arg` is a flag of parseFlags() that takes its value from the
/// next word ("--manifests", "-v"; not "--manifests=DIR" nor the bool "--masquerade-all").
bool flagTakesNextArgument(std::string_view arg);

/// The effective configuration, with upstream kube-proxy's precedence
/// (cmd/kube-proxy/app/options.go, Options.Complete):
///  - Without --config: the defaults, overridden by the flags given. Without --write-config-to
///    either, the deprecated --healthz-port / --metrics-port then apply as upstream's
///    addressFromDeprecatedFlags: 0 disables the server, another port is appended to a
///    --healthz-bind-address / --metrics-bind-address given without one.
///  - With --config: the file's values (with upstream's defaults for what it leaves unset)
///    REPLACE the configuration flags entirely; a configuration flag given on the command line
///    is ignored (upstream documents "This parameter is ignored if a config file is specified by
///    --config"; see ignoredFlags()). Exceptions, as upstream: the logging flags given (-v,
///    --logging-format) override the file, and --hostname-override, when non-empty, overrides
///    the file's hostnameOverride. The logging flags are -v, --vmodule, --logging-format,
///    --log-flush-frequency and the --log-{text,json}-{split-stream,info-buffer-size} flags.
///  - --hostname-override is trimmed and lower-cased; one that is blank after trimming is an
///    error.
///  - Process flags (--master, --cleanup, --init-only, --write-config-to, --manifests,
///    --plugin-dir, --dry-run, --help, --version) are never in the file and always apply.
/// Then applyPlatformDefaults() runs. The result is not validated: call validate().
core::Result<ProxyConfig> effectiveConfig(const ParsedFlags& flags);

/// The configuration flags that were given but that effectiveConfig() ignores because --config
/// was given, in flag-name order (for a warning at start-up). Empty without --config.
std::vector<std::string> ignoredFlags(const ParsedFlags& flags);

/// The help text: a usage line and every flag with its argument type, default and meaning.
std::string usage();

}  // namespace kproxy::cli
