#!/usr/bin/env bash
# Builds a real kube-apiserver (and, if Debian's etcd is not usable, etcd) from
# the Go module proxy into ~/.cache/kproxy/bin; `kube-proxy` builds upstream's
# kube-proxy the same way for the side-by-side benchmark (bench/compare). Idempotent: a finished build is
# reused, so later runs start at once.
#
# kube-apiserver is built through a throwaway module that requires
# k8s.io/kubernetes; that module's go.mod replaces every k8s.io/* staging module
# with ./staging/..., which only works inside the kubernetes tree, so we pin
# each of them to the matching v0.x tag instead.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.5.21}
CACHE=${KPROXY_CACHE:-$HOME/.cache/kproxy}
BIN=$CACHE/bin
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=mod
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0
# Two shared cores: stay polite to other builds unless told otherwise.
export GOMAXPROCS=${GOMAXPROCS:-1}
NICE=(nice -n 10)
mkdir -p "$BIN"

log() { printf '%s build-control-plane: %s\n' "$(date +%T)" "$*" >&2; }

# build_k8s_cmd NAME — cmd/NAME of k8s.io/kubernetes at K8S_VERSION (kube-apiserver for the
# tests, kube-proxy for the side-by-side benchmark), through one shared throwaway module.
build_k8s_cmd() {
    local name=$1 out=$BIN/$1
    if [[ -x $out && -f $out.version && $(cat "$out.version") == "$K8S_VERSION" ]]; then
        log "$name $K8S_VERSION cached at $out"
        return
    fi
    local src=$CACHE/apiserver-src
    mkdir -p "$src"
    local staging=v0.${K8S_VERSION#v1.}
    log "fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
    local gomod
    gomod=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    {
        echo "module kproxy.local/apiserver"
        echo
        sed -n 's/^go \([0-9.]*\)$/go \1/p' "$gomod" | head -1
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        echo "replace ("
        # Every "k8s.io/x => ./staging/src/k8s.io/x" line becomes a version pin.
        sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\t\1 => \1 '"$staging"'#p' "$gomod"
        echo ")"
    } > "$src/go.mod"
    cat > "$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
    log "building $name $K8S_VERSION (staging $staging); this takes long on a cold cache"
    local start=$SECONDS
    (cd "$src" && "${NICE[@]}" go mod tidy -e >/dev/null 2>&1 || true)
    (cd "$src" && "${NICE[@]}" go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION")" \
        -o "$out.tmp" "k8s.io/kubernetes/cmd/$name")
    mv "$out.tmp" "$out"
    echo "$K8S_VERSION" > "$out.version"
    log "$name built in $((SECONDS - start)) s"
}

build_etcd() {
    local out=$BIN/etcd
    if [[ -x $out && -f $out.version && $(cat "$out.version") == "$ETCD_VERSION" ]]; then
        log "etcd $ETCD_VERSION cached at $out"
        return
    fi
    local src=$CACHE/etcd-src
    mkdir -p "$src"
    cat > "$src/go.mod" <<GOMOD
module kproxy.local/etcd

go 1.23

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
    log "building etcd $ETCD_VERSION"
    local start=$SECONDS
    (cd "$src" && "${NICE[@]}" go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 || true)
    (cd "$src" && "${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3)
    mv "$out.tmp" "$out"
    echo "$ETCD_VERSION" > "$out.version"
    log "etcd built in $((SECONDS - start)) s"
}

# fetch_prometheus — Debian's prometheus binary for the end-to-end tier's scrape test, taken
# from its package with `apt-get download` and never installed: installing it would start a
# system-wide prometheus.service on :9090 on a systemd machine and pull ~100 MB of web-UI
# packages that the test does not use (it queries the HTTP API only).
fetch_prometheus() {
    local out=$BIN/prometheus version
    version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ { print $2 }')
    if [[ -z $version || $version == "(none)" ]]; then
        apt-get update -qq >&2
        version=$(apt-cache policy prometheus | awk '/Candidate:/ { print $2 }')
    fi
    [[ -n $version && $version != "(none)" ]] || { log "apt knows no prometheus package"; return 1; }
    if [[ -x $out && -f $out.version && $(cat "$out.version") == "$version" ]]; then
        log "prometheus $version cached at $out"
        return
    fi
    local tmp
    tmp=$(mktemp -d "$CACHE/.prometheus.XXXXXX")
    trap 'rm -rf "$tmp"' RETURN
    log "downloading Debian's prometheus $version"
    if ! (cd "$tmp" && apt-get download "prometheus=$version" >&2); then
        apt-get update -qq >&2  # the lists may name a version the mirror no longer has
        (cd "$tmp" && apt-get download "prometheus=$version" >&2)
    fi
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
    install -m 0755 "$tmp/root/usr/bin/prometheus" "$out.tmp"
    mv "$out.tmp" "$out"
    echo "$version" >"$out.version"
}

case "${1:-all}" in
    apiserver) build_k8s_cmd kube-apiserver ;;
    kube-proxy) build_k8s_cmd kube-proxy ;;
    etcd) build_etcd ;;
    prometheus) fetch_prometheus ;;
    all)
        build_k8s_cmd kube-apiserver
        if ! command -v etcd >/dev/null && [[ ! -x $BIN/etcd ]]; then build_etcd; fi
        fetch_prometheus
        ;;
    *) echo "usage: $0 [all|apiserver|kube-proxy|etcd|prometheus]" >&2; exit 2 ;;
esac
