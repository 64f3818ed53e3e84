# Checks a document written by examples/backend-json against what it must hold; true or false.
# Usage: jq -e --argjson want WANT -f check_desired_state.jq FILE
# WANT: {"node": NAME, "ports": {KEY: {"type": T, "clusterIP": IP, "port": N, "nodePort": N,
#        "endpoints": ["ip:port", ...]}}}: exactly these service ports (IPv4), with these
#        cluster endpoints (any order), each ready.
def ports:
  [.servicePorts[]
   | {key: .key,
      value: {type, clusterIP, port, nodePort,
              endpoints: ([.clusterEndpoints[] | select(.ready) | "\(.ip):\(.port)"] | sort)}}]
  | from_entries;
(.node.name == $want.node)
and ([.servicePorts[].family] | all(. == "IPv4"))
and (ports == ($want.ports | map_values(.endpoints |= sort)))
