#!/usr/bin/env bash
# Builds Moat's three container images with podman where no image registry
# is reachable (air-gapped build hosts, CI sandboxes): nothing is pulled.
#
#   localhost/moat-agent:TAG         Debian bookworm + nftables + moat-agent
#   localhost/moat-proxy-server:TAG  scratch + moat-proxy-server
#   localhost/moat-proxy-agent:TAG   scratch + moat-proxy-agent
#
# The images come from the same deploy/images/Dockerfile that builds them
# with a registry; only two inputs are replaced:
#   - the agent's base: a Debian rootfs made with mmdebstrap from the Debian
#     mirror (apt's usual source), with nftables already installed, imported
#     as localhost/moat-base:<suite>-<arch>-<key>, in place of
#     debian:bookworm-slim (--build-arg BASE_IMAGE);
#   - the "build" stage, which needs a golang image: it is replaced by the
#     three binaries, built here with the local Go toolchain (static,
#     CGO_ENABLED=0, -trimpath) and given as the build context.
#
# The rootfs tarball is cached outside the clone, keyed by a hash of every
# input of mmdebstrap (suite, mirrors, packages, options, mmdebstrap version),
# like hack/kube/build.sh caches kube-apiserver:
#   ${MOAT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moat/image}/debian-<suite>-<arch>-<key>.tar
# A cold build takes about half a minute; set MOAT_IMAGE_REFRESH=1 to build
# it again (for Debian's security updates).
#
# podman reads its usual configuration. Where containers cannot run with it
# (see docs/install.md), point CONTAINERS_CONF and CONTAINERS_STORAGE_CONF
# at files of your own; the image test (deploy/images) does exactly that.
#
# The images are for this machine's architecture.
#
# Usage: hack/image/build.sh [TAG]     (PODMAN=podman)
# The default TAG is the version of this tree (deploy.Version, e.g. v0.1.0),
# the tag every manifest in deploy/ names, so that images built here run
# with the manifests unchanged.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${here}/../.." && pwd)
# shellcheck source=hack/lib/packages.sh
source "${repo}/hack/lib/packages.sh"
# shellcheck source=hack/lib/version.sh
source "${repo}/hack/lib/version.sh"

if [[ $# -ge 1 ]]; then
	tag=$1
else
	tag=$(moat_version "${repo}")
fi
if [[ $# -gt 1 || ${tag} == -* ]]; then
	echo "usage: $0 [TAG]" >&2
	exit 2
fi
podman=${PODMAN:-podman}
cache_root=${MOAT_IMAGE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/moat/image}

ensure_packages podman:podman runc:runc mmdebstrap:mmdebstrap

goarch=$(go env GOARCH)
suite=bookworm
# Debian calls architectures as Go does for amd64, arm64, ppc64le, s390x,
# riscv64; only 32-bit ARM differs.
case ${goarch} in
arm) debarch=armhf ;;
386) debarch=i386 ;;
*) debarch=${goarch} ;;
esac
mirrors=(
	"deb http://deb.debian.org/debian ${suite} main"
	"deb http://deb.debian.org/debian ${suite}-updates main"
	"deb http://deb.debian.org/debian-security ${suite}-security main"
)
# essential: only Debian's Essential:yes set (a shell, coreutils, dpkg, no
# apt) plus nftables for the nft binary that knftables runs. The merged-usr
# hook lays out /usr without the usrmerge package (which would pull in
# perl, 50 MB). Documentation is left out.
mm_args=(
	--variant=essential
	--include=nftables
	--architectures="${debarch}"
	--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
	--dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-exclude=/usr/share/info/*'
	--dpkgopt='path-exclude=/usr/share/locale/*'
	--dpkgopt='path-exclude=/usr/share/lintian/*'
)
key=$(printf '%s\n' "${suite}" "${mm_args[@]}" "${mirrors[@]}" "$(mmdebstrap --version)" | sha256sum | cut -c1-16)
base_tar=${cache_root}/debian-${suite}-${debarch}-${key}.tar
base_image=localhost/moat-base:${suite}-${debarch}-${key}

mkdir -p "${cache_root}"
(
	# Serialise concurrent runs (two clones, or CI and a developer).
	flock 9
	if [[ -s ${base_tar} && ${MOAT_IMAGE_REFRESH:-} != 1 ]]; then
		echo "image/build.sh: base rootfs ${base_tar##*/} is cached" >&2
	else
		echo "image/build.sh: building the Debian ${suite} rootfs with mmdebstrap" >&2
		start=${SECONDS}
		tmp=${base_tar}.tmp.$$
		if ! mmdebstrap --quiet --format=tar "${mm_args[@]}" "${suite}" "${tmp}" "${mirrors[@]}" >"${tmp}.log" 2>&1; then
			cat "${tmp}.log" >&2
			rm -rf "${tmp}" "${tmp}.log"
			exit 1
		fi
		rm -f "${tmp}.log"
		mv -f "${tmp}" "${base_tar}"
		echo "image/build.sh: built ${base_tar##*/} in $((SECONDS - start))s" >&2
	fi
) 9>"${cache_root}/.lock"

if [[ ${MOAT_IMAGE_REFRESH:-} == 1 ]] || ! "${podman}" image exists "${base_image}"; then
	"${podman}" import --quiet \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		"${base_tar}" "${base_image}" >/dev/null
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/moat-image.XXXXXX")
trap 'rm -rf "${ctx}"' EXIT
echo "image/build.sh: building the binaries (linux/${goarch})" >&2
(
	cd "${repo}"
	CGO_ENABLED=0 GOOS=linux GOARCH=${goarch} \
		go build -trimpath -ldflags="-s -w" -o "${ctx}/" ./cmd/moat-agent ./cmd/moat-proxy-server ./cmd/moat-proxy-agent
)

# The Dockerfile with its "build" stage (from its FROM to the next FROM)
# replaced by the binaries in the context; every other line as written.
awk '
	/^FROM .* AS build$/ { print "FROM scratch AS build"; print "COPY moat-agent moat-proxy-server moat-proxy-agent /out/"; skip = 1; n++; next }
	/^FROM / { skip = 0 }
	!skip { print }
	END { if (n != 1) { print "deploy/images/Dockerfile: want exactly one \"FROM ... AS build\" stage, found " n > "/dev/stderr"; exit 1 } }
' "${repo}/deploy/images/Dockerfile" >"${ctx}/Dockerfile"

for target in moat-agent moat-proxy-server moat-proxy-agent; do
	"${podman}" build --quiet --pull=never \
		--file "${ctx}/Dockerfile" \
		--target "${target}" \
		--build-arg BASE_IMAGE="${base_image}" \
		--tag "localhost/${target}:${tag}" \
		"${ctx}" >/dev/null
	size=$("${podman}" image inspect --format '{{.Size}}' "localhost/${target}:${tag}")
	echo "image/build.sh: built localhost/${target}:${tag} ($((size / 1000000)) MB)" >&2
done
