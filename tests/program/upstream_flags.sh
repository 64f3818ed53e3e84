#!/usr/bin/env bash
# Every flag upstream kube-proxy v1.34 registers (tests/program/data/upstream-flags-1.34.txt) is
# accepted by the kproxy program with the value beside it; `_` in a name reads as `-`; the
# deprecated flags warn in pflag's words; an unknown flag is still refused. Each run stops at
# --write-config-to, after the flags are parsed, the configuration resolved and validated, and
# before anything touches the kernel: no root, no namespace.
# Usage: upstream_flags.sh KPROXY_BIN FLAG_LIST
set -uo pipefail
KPROXY=$1
LIST=$2
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
make_workdir upstream-flags

cat >"$WORK/config.yaml" <<'YAML'
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
YAML

count=0
while read -r name value; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  count=$((count + 1))
  value=${value//@CONFIG@/$WORK/config.yaml}
  value=${value//@OUT@/$WORK/written.yaml}
  args=("--$name=$value")
  [[ "$name" != write-config-to ]] && args+=(--write-config-to "$WORK/written.yaml")
  out=$("$KPROXY" "${args[@]}" 2>&1); rc=$?
  if [[ $rc -eq 0 && "$out" != *"unknown flag"* ]]; then
    pass "--$name is accepted"
  else
    fail "--$name is accepted" "rc=$rc: $(head -3 <<<"$out")"
  fi
done <"$LIST"
# A list that lost its lines would pass vacuously.
if ((count >= 55)); then pass "the list holds upstream's flags ($count)"; else fail "the list" "only $count flags"; fi

# `_` reads as `-` (upstream's WordSepNormalizeFunc), for the flag's value to take effect.
out=$("$KPROXY" --iptables_sync_period=45s --proxy_mode=iptables --write-config-to "$WORK/n.yaml" 2>&1); rc=$?
if [[ $rc -eq 0 ]] && grep -q 'syncPeriod: 45s' "$WORK/n.yaml" && grep -q '^mode: iptables' "$WORK/n.yaml"; then
  pass "underscores in flag names read as dashes"
else
  fail "underscores" "rc=$rc $out"
fi

# The deprecated flags work and warn as pflag does.
out=$("$KPROXY" --healthz-port=10256 --metrics-port=10249 --write-config-to "$WORK/d.yaml" 2>&1); rc=$?
if [[ $rc -eq 0 && "$out" == *"Flag --healthz-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead."* &&
      "$out" == *"Flag --metrics-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead."* ]]; then
  pass "deprecated flags warn in pflag's words"
else
  fail "deprecated flags warn" "rc=$rc $out"
fi

# --version names kproxy's version, the commit and the Kubernetes release it follows (the one of
# this flag list).
out=$("$KPROXY" --version 2>&1); rc=$?
follows=$(sed -n 's/.*upstream-flags-\([0-9.]*\)\.txt$/\1/p' <<<"$LIST")
if [[ $rc -eq 0 && "$out" =~ ^kproxy\ [0-9]+\.[0-9]+\.[0-9]+\ \(commit\ ([0-9a-f]{12}(-dirty)?|unknown)\;\ follows\ Kubernetes\ v${follows//./\\.}\.[0-9]+\)$ ]]; then
  pass "--version names the version, the commit and the Kubernetes release followed"
else
  fail "--version" "rc=$rc out=$out (want Kubernetes v$follows.x)"
fi

out=$("$KPROXY" --no_such_flag 2>&1); rc=$?
if [[ $rc -eq 1 && "$out" == "kproxy: unknown flag: --no_such_flag" ]]; then pass "an unknown flag is still refused"; else fail "unknown flag" "rc=$rc $out"; fi

finish upstream_flags
