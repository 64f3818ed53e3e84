#!/usr/bin/env bash
# Installs everything kproxy needs to build, test and run its demo, from Debian's packages.
# Idempotent: when every package is present it does nothing (no apt-get update).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache
  libboost-dev libboost-system-dev libssl-dev
  nlohmann-json3-dev libyaml-cpp-dev libfmt-dev catch2
  libnftnl-dev libmnl-dev libnl-3-dev libnl-genl-3-dev libnl-route-3-dev
  nftables iptables iproute2 conntrack curl procps openssl
  python3 python3-yaml
  iperf3  # bench/userspace
  etcd-server
  jq
  qemu-system-x86 cpio kmod
  clang-19 libclang-rt-19-dev llvm-19
  libbpf-dev bpftool  # ebpf mode: libbpf, skeletons and vmlinux.h (clang-19 compiles the programs)
)

# python3 (and python3-yaml) serve the program, end-to-end and soak tiers and bench/, which check
# JSON and drive the API server with it; the demo and the data-path suite need no interpreter
# (their pods run kproxy-podserver, tests/tools).
# qemu, cpio and kmod (depmod) build and boot the IPVS test VM (tests/vm/): its kernel, busybox,
# ipvsadm and ipset are fetched with `apt-get download` into ~/.cache/kproxy/vm, not installed.

# The end-to-end tier builds kube-apiserver from the Go module proxy; Debian 12's Go is too old
# for it, so it uses the Go toolchain this machine kind ships (go 1.24 or newer on PATH).
if ! command -v go >/dev/null; then
  echo "install-deps: WARNING: no 'go' on PATH: the end-to-end tier (real kube-apiserver) cannot be built" >&2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
