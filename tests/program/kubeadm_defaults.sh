#!/usr/bin/env bash
# kproxy fed what `kubeadm init` gives kube-proxy (tests/program/data/kubeadm/: the ConfigMap
# with config.conf, `mode: ""` and every other field zero, and the container's command line):
# it must start in iptables mode, upstream's default on Linux, with upstream's defaults, and
# /configz must show them. The ConfigMap is "mounted" in a work directory; this tier has no API
# server, so kproxy reads its objects from a manifest directory (--manifests, kproxy's own flag,
# added to kubeadm's command line). In an anonymous network namespace (root).
# Usage: kubeadm_defaults.sh KPROXY_BIN DATA_DIR
set -uo pipefail
KPROXY=$1
DATA=$2
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
require_root kubeadm_defaults "a network namespace"
enter_own_netns kubeadm_defaults "$@"
make_workdir kubeadm
make_lb_fixture  # $M: the Node node-a
write_lb web 10.96.0.50 31080 node-a  # NodePort 30080

# The ConfigMap's keys as files, as its volume mounts them.
MOUNT="$WORK/kube-proxy"; mkdir -p "$MOUNT"
for key in config.conf kubeconfig.conf; do
  awk -v key="  $key: |-" '
    $0 == key { inside = 1; next }
    inside && /^    / { print substr($0, 5); next }
    inside { exit }' "$DATA/kube-proxy-configmap.yaml" >"$MOUNT/$key"
done
grep -q '^mode: ""$' "$MOUNT/config.conf" || { echo "kubeadm_defaults: config.conf not extracted" >&2; exit 1; }

# kubeadm's command line, with this build's kproxy for its kube-proxy.
args=()
while read -r word; do
  [[ -z "$word" || "$word" == \#* || "$word" == */kube-proxy ]] && continue
  word=${word//\/var\/lib\/kube-proxy\//$MOUNT/}
  args+=("${word//\$(NODE_NAME)/node-a}")
done <"$DATA/kube-proxy-command.txt"
"$KPROXY" "${args[@]}" --manifests "$M" >"$WORK/kproxy.log" 2>&1 &
KP=$!; PIDS+=("$KP")

MET=http://127.0.0.1:10249
healthy() { is_code 200 http://127.0.0.1:10256/healthz; }
DETAIL=$(tail -5 "$WORK/kproxy.log")
check "kproxy starts on kubeadm's ConfigMap and command line, and syncs" wait_for "$HANG_CEILING" healthy
check "it runs in iptables mode" grep -q '"starting".*mode="iptables"' "$WORK/kproxy.log"
check "it recommends nftables mode once, with the benchmark's figure" \
  eval '[ "$(grep -c "consider --proxy-mode=nftables" "$WORK/kproxy.log")" = 1 ] && grep -q "9.1 ms against iptables mode.s 193 ms" "$WORK/kproxy.log"'
mode=$(curl -s --max-time "$REQUEST_CEILING" "$MET/proxyMode")
DETAIL="got '$mode'"; check "/proxyMode says iptables" test "$mode" = iptables

curl -s --max-time "$REQUEST_CEILING" "$MET/configz" >"$WORK/configz.json"
# field JQ_PATH WANT: /configz holds WANT (as jq prints it, compact) at JQ_PATH.
field() {
  local got
  got=$(jq -c ".\"kubeproxy.config.k8s.io\"$1" "$WORK/configz.json" 2>&1)
  DETAIL="got $got"; check "/configz $1 is $2" test "$got" = "$2"
}
field .mode '"iptables"'
field .bindAddress '"0.0.0.0"'
field .healthzBindAddress '"0.0.0.0:10256"'
field .metricsBindAddress '"127.0.0.1:10249"'
field .clusterCIDR '"10.244.0.0/16"'
field .hostnameOverride '"node-a"'
field .detectLocalMode '"ClusterCIDR"'
field .nodePortAddresses 'null'
field .oomScoreAdj '-999'
field .configSyncPeriod '"15m0s"'
field .iptables.syncPeriod '"30s"'
field .iptables.minSyncPeriod '"1s"'
field .iptables.masqueradeBit '14'
field .iptables.localhostNodePorts 'true'
field .iptables.masqueradeAll 'false'
field .conntrack.maxPerCore '32768'
field .conntrack.min '131072'
field .conntrack.tcpEstablishedTimeout '"24h0m0s"'
field .conntrack.tcpCloseWaitTimeout '"1h0m0s"'
field .clientConnection.kubeconfig '"/var/lib/kube-proxy/kubeconfig.conf"'  # as the file says
field .clientConnection.contentType '"application/vnd.kubernetes.protobuf"'
field .clientConnection.qps '5'
field .clientConnection.burst '10'
field .logging.flushFrequency '"5s"'
field .logging.format '"text"'
field .enableProfiling 'false'

# The kernel: upstream's iptables layout, NodePorts on every local address, no nftables table.
DETAIL=$(iptables-save -t nat 2>&1 | grep -E 'KUBE-(SERVICES|NODEPORTS)' | head -5)
check "iptables holds KUBE-SERVICES with the NodePort jump for every local address" \
  eval 'iptables-save -t nat | grep -q -- "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"'
check "the Service's NodePort is in KUBE-NODEPORTS" eval 'iptables-save -t nat | grep -q -- "-A KUBE-NODEPORTS .*--dport 30080"'
DETAIL=$(nft list tables 2>&1)
check "no nftables mode table" eval '! nft list tables 2>/dev/null | grep -q "kube-proxy"'

finish kubeadm_defaults
