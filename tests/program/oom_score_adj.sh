#!/usr/bin/env bash
# --oom-score-adj and the config file's oomScoreAdj are applied to the running kproxy
# (/proc/PID/oom_score_adj), as upstream's ProxyServer.Run does; the default is upstream's -999.
# In an anonymous network namespace (root). Lowering the score needs CAP_SYS_RESOURCE, which a
# container may lack: there the default's -999 is checked as upstream handles a refusal (logged
# at -v 2, and kproxy runs on).
# Usage: oom_score_adj.sh KPROXY_BIN
set -uo pipefail
KPROXY=$1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
require_root oom_score_adj "a network namespace; lowering oom_score_adj"
enter_own_netns oom_score_adj "$@"
make_workdir oom
mkdir -p "$WORK/manifests"

# started_with NAME ARGS...: kproxy in the background until it logs "starting"; its pid in KP.
started_with() {
  local name=$1; shift
  "$KPROXY" --manifests "$WORK/manifests" --hostname-override node-a "$@" >"$WORK/$name.log" 2>&1 &
  KP=$!; PIDS+=("$KP")
  wait_for "$HANG_CEILING" grep -q '"starting"' "$WORK/$name.log"
}
score() { cat "/proc/$KP/oom_score_adj" 2>/dev/null; }
stop() { kill "$KP" 2>/dev/null; wait "$KP" 2>/dev/null; }

echo 0 >/proc/self/oom_score_adj  # what kproxy inherits
started_with flag --proxy-mode=nftables --oom-score-adj=500
DETAIL="score $(score); $(tail -3 "$WORK/flag.log")"
check "--oom-score-adj=500 is applied" [ "$(score)" = 500 ]
stop

started_with default --proxy-mode=nftables -v 2
if (echo -1 >/proc/self/oom_score_adj) 2>/dev/null; then
  DETAIL="score $(score)"
  check "the default is upstream's -999" [ "$(score)" = -999 ]
else
  DETAIL="score $(score); $(grep -i oom "$WORK/default.log")"
  check "the default -999, refused without CAP_SYS_RESOURCE, is logged and kproxy runs on" \
    eval '[ "$(score)" = 0 ] && grep -q "Failed to apply OOMScore" "$WORK/default.log" && kill -0 "$KP"'
fi
stop

cat >"$WORK/config.yaml" <<'YAML'
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
oomScoreAdj: 250
YAML
started_with file --config "$WORK/config.yaml"
DETAIL="score $(score)"
check "the config file's oomScoreAdj is applied" [ "$(score)" = 250 ]
stop

finish oom_score_adj
