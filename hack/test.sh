#!/usr/bin/env bash
# Runs Moat's whole test suite. On a fresh machine that has only Go it first
# installs what the tests need: nftables and iproute2 from Debian (for the
# dataplane, lab and tunnel tests in network namespaces) and a real
# kube-apiserver and etcd built from the Go module proxy (hack/kube/build.sh;
# ~9 minutes cold, seconds when cached); podman, runc and mmdebstrap from
# Debian for the image test (deploy/images, which runs podman with its own
# configuration and storage and changes nothing of the machine's podman
# setup). Privileged tests need root.
#
# Usage: hack/test.sh [go test flags...]   e.g. hack/test.sh -run TestTier ./policy/
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source hack/lib/packages.sh

# chromium: the HTML matrix test drives it headless.
ensure_packages nft:nftables ip:iproute2 podman:podman runc:runc mmdebstrap:mmdebstrap chromium:chromium
if [[ $(id -u) -eq 0 ]]; then
	mkdir -p /var/run/netns # where the lab and tunnel tests keep named network namespaces
fi
bash hack/kube/build.sh

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './hack/*'))
if [[ -n ${unformatted} ]]; then
	echo "gofmt needed:" >&2
	echo "${unformatted}" >&2
	exit 1
fi
go vet ./...

if [[ $# -gt 0 ]]; then
	exec go test -count=1 "$@"
fi

go test -count=1 -timeout 80m ./...

# Fuzz targets, a few seconds each: decode -> validate -> compile -> evaluate
# must never panic; the JSON scanner accepts exactly what encoding/json does.
for pkg in ./policy/ ./decode/; do
	for target in $(go test -list '^Fuzz' "${pkg}" | grep '^Fuzz'); do
		go test -run '^$' -fuzz "^${target}\$" -fuzztime 10s "${pkg}"
	done
done
