#!/usr/bin/env bash
# Installs what the nft and lab tests need: the nft binary (nftables) and
# iproute2 (ip netns, for exploring labs). Run as root; idempotent.
set -euo pipefail
missing=()
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if ((${#missing[@]})); then
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}"
fi
nft --version
# The lab keeps named network namespaces here; make sure it exists.
mkdir -p /var/run/netns
