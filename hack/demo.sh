#!/usr/bin/env bash
# Moat's main job on the embedded quickstart example, on this machine: builds
# the example's nodes and pods as network namespaces, programs each node with
# the nftables rules the agent would, probes every flow with real TCP and UDP
# packets and compares what it measured with what the policy engine predicts.
# Needs root (network namespaces, nftables): re-runs itself with sudo when
# not root (hack/lib/root.sh); installs nftables and iproute2 when missing.
# Extra arguments go to `moat lab run` (e.g. -f examples/passive-ftp).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source hack/lib/root.sh
run_as_root "${PWD}/hack/demo.sh" "$@" # sudo, from any directory; root's own Go caches
source hack/lib/packages.sh
ensure_packages nft:nftables ip:iproute2
exec go run ./cmd/moat lab run "$@"
