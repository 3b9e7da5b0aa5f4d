#!/usr/bin/env bash
# Runs the tunnel's tests as CI does: as root, with iproute2 for the
# network-namespace tests (KEP-2025, bind address). The real-kube-apiserver
# test (TestTokenReviewRealAPIServer) needs hack/kube/build.sh to have built
# kube-apiserver and etcd; with CI=true it fails rather than skips without them.
# About 35 s on 2 cores with a warm build cache.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v ip >/dev/null 2>&1; then
	apt-get update -qq && apt-get install -y -qq iproute2
fi
if [ "$(id -u)" != 0 ]; then
	echo "hack/tunnel/test.sh: not root: namespace tests will skip" >&2
fi
go test -count=1 -timeout 15m ./tunnel/... ./cmd/moat-proxy-server ./cmd/moat-proxy-agent "$@"
