#!/usr/bin/env bash
# deploy/ as a cluster would run it: the ConfigMap's config.yaml "mounted" where the DaemonSets
# mount it, and every container's command line from daemonset.yaml,
# daemonset-unprivileged.yaml and daemonset-ebpf.yaml run with this build's kproxy: the main
# containers' with --dry-run (one sync of a manifest directory, nothing programmed; this tier has no API server), the
# initContainer's --init-only for real in this namespace. Also the host-process config.yaml. In
# an anonymous network namespace (root).
# Usage: deploy_manifests.sh KPROXY_BIN SOURCE_DIR
set -uo pipefail
KPROXY=$1
SRC=$2
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
require_root deploy_manifests "a network namespace"
enter_own_netns deploy_manifests "$@"
make_workdir deploy
make_lb_fixture  # $M: the Node node-a
write_lb web 10.96.0.50 31080 node-a

# The ConfigMap's keys as files, as its volume mounts them.
MOUNT="$WORK/kproxy"; mkdir -p "$MOUNT"
python3 - "$SRC/deploy/configmap.yaml" "$MOUNT" <<'PY' || { echo "deploy_manifests: configmap.yaml unreadable" >&2; exit 1; }
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "ConfigMap":
        for key, value in doc["data"].items():
            open(f"{sys.argv[2]}/{key}", "w").write(value)
PY

# commands FILE: one line per container, "init|main NAME<TAB>word<TAB>word...", with the
# ConfigMap's mount path and $(NODE_NAME) as the kubelet would expand them here.
commands() {
  python3 - "$1" "$MOUNT" <<'PY'
import sys, yaml
mount = sys.argv[2]
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if not doc or doc.get("kind") != "DaemonSet":
        continue
    spec = doc["spec"]["template"]["spec"]
    mounts = {v["name"]: v for v in spec["volumes"]}
    for kind, containers in (("init", spec.get("initContainers", [])), ("main", spec["containers"])):
        for c in containers:
            words = c["command"] + c.get("args", [])
            for m in c.get("volumeMounts", []):
                if "configMap" in mounts[m["name"]]:
                    words = [w.replace(m["mountPath"], mount) for w in words]
            words = [w.replace("$(NODE_NAME)", "node-a") for w in words]
            print(kind + " " + c["name"] + "\t" + "\t".join(words[1:]))
PY
}

for file in daemonset.yaml daemonset-unprivileged.yaml daemonset-ebpf.yaml; do
  # The mode each main container must start: the ConfigMap's, but where the DaemonSet says
  # otherwise on its command line (ebpf, without --config).
  mode=nftables; [[ $file == daemonset-ebpf.yaml ]] && mode=ebpf
  lines=$(commands "$SRC/deploy/$file")
  DETAIL="no containers read from $file"; check "$file: its containers are read" test -n "$lines"
  while IFS=$'\t' read -r -a words; do
    [[ ${#words[@]} -gt 0 ]] || continue
    what=${words[0]}; args=("${words[@]:1}"); log="$WORK/${file%.yaml}-${what// /-}.log"
    if [[ $what == init* ]]; then
      timeout "$HANG_CEILING" "$KPROXY" "${args[@]}" >"$log" 2>&1; rc=$?
      DETAIL="rc=$rc: $(tail -5 "$log")"
      check "$file: $what (${args[*]}) exits 0" test "$rc" = 0
    else
      timeout "$HANG_CEILING" "$KPROXY" "${args[@]}" --dry-run --manifests "$M" >"$log" 2>&1; rc=$?
      DETAIL="rc=$rc: $(grep -E '^[EF]' "$log" | head -3; tail -3 "$log")"
      check "$file: $what (${args[*]}) syncs once with --dry-run and exits 0" test "$rc" = 0
      DETAIL=$(grep -E '"starting"|flag ignored|^E' "$log" | head -3)
      check "$file: $what runs mode $mode, with no flag ignored and no error" \
        eval 'grep -q "\"starting\".*mode=\"$mode\"" "$log" && ! grep -qE "flag ignored|^E" "$log"'
    fi
  done <<<"$lines"
done

# The host-process example (deploy/kproxy.service's --config).
timeout "$HANG_CEILING" "$KPROXY" --config "$SRC/deploy/config.yaml" --hostname-override=node-a \
  --dry-run --manifests "$M" >"$WORK/host.log" 2>&1; rc=$?
DETAIL="rc=$rc: $(tail -5 "$WORK/host.log")"
check "config.yaml: kproxy accepts it and syncs once with --dry-run" test "$rc" = 0

finish deploy_manifests
