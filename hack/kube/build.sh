#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd that the integration tests
# (internal/kubetest) run on loopback. Neither is packaged by Debian in a
# usable version, so both are built from the Go module proxy through two
# nested modules (hack/kube/apiserver, hack/kube/etcd). They are separate
# modules so that Go's version selection for one never moves the other's
# dependencies, and nested so that the project's ./... ignores them.
#
# The binaries are cached outside the clone, keyed by version and by a hash of
# every build input, so a fresh clone on the same machine (CI) finds them in
# seconds:
#   ${MOAT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moat/kube}/kube-apiserver-v1.37.1/kube-apiserver
#   ${MOAT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moat/kube}/etcd-v3.7.3/etcd
# and then linked (or copied) into the git-ignored bin/ of the repository.
#
# Usage: hack/kube/build.sh [--print]
#   --print  only print where the binaries are (exit 1 if any is missing).
# A cold build takes about 9 minutes on 2 cores (3 GB of Go build cache,
# 2.4 GB peak memory); a warm run takes a second.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "${here}/../.." && pwd)
cache_root=${MOAT_KUBE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/moat/kube}
bin_dir=${repo}/bin

# version_of MODULE_DIR MODULE prints the version MODULE is required at in
# MODULE_DIR/go.mod, so go.mod stays the single place a version is pinned.
version_of() {
	local v
	v=$(awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod")
	if [[ -z ${v} ]]; then
		echo "build.sh: cannot find the version of $2 in $1/go.mod" >&2
		exit 1
	fi
	echo "${v}"
}

kube_version=$(version_of "${here}/apiserver" k8s.io/kubernetes)
etcd_version=$(version_of "${here}/etcd" go.etcd.io/etcd/server/v3)

kube_minor=${kube_version#v1.}
kube_minor=${kube_minor%%.*}
# The same version variables the Kubernetes release build sets
# (hack/lib/version.sh upstream); without them the server reports v0.0.0.
# buildDate is left at its default so the link is reproducible.
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X ${pkg}.gitVersion=${kube_version} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${kube_minor} -X ${pkg}.gitTreeState=clean"
done
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${etcd_version}"

go_version=$(go env GOVERSION)
go_arch=$(go env GOOS)/$(go env GOARCH)

# build NAME VERSION MODULE_DIR PACKAGE LDFLAGS builds NAME into the cache
# unless a binary built from exactly the same inputs is already there, then
# links it into bin/.
build() {
	local name=$1 version=$2 mod_dir=$3 pkg=$4 ldflags=$5
	local dir=${cache_root}/${name}-${version}
	local out=${dir}/${name}
	local stamp
	stamp=$(
		{
			cat "${mod_dir}/go.mod" "${mod_dir}/go.sum"
			echo "${pkg} ${ldflags} ${go_version} ${go_arch} CGO_ENABLED=0 -trimpath"
		} | sha256sum | cut -d' ' -f1
	)
	mkdir -p "${dir}"
	(
		# Serialise concurrent runs (two clones, or CI and a developer).
		flock 9
		if [[ -x ${out} && -f ${out}.stamp && $(cat "${out}.stamp") == "${stamp}" ]]; then
			echo "build.sh: ${name} ${version} is cached" >&2
		else
			echo "build.sh: building ${name} ${version} (${pkg}); this takes minutes when cold" >&2
			local start=${SECONDS}
			local tmp=${out}.tmp.$$
			(
				cd "${mod_dir}"
				GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly" CGO_ENABLED=0 \
					go build -trimpath -ldflags "${ldflags}" -o "${tmp}" "${pkg}"
			) || {
				rm -f "${tmp}"
				exit 1
			}
			mv -f "${tmp}" "${out}"
			echo "${stamp}" >"${out}.stamp"
			echo "build.sh: built ${name} ${version} in $((SECONDS - start))s" >&2
		fi
	) 9>"${dir}/.lock"
	mkdir -p "${bin_dir}"
	if ! cmp -s "${out}" "${bin_dir}/${name}"; then
		rm -f "${bin_dir}/${name}"
		ln "${out}" "${bin_dir}/${name}" 2>/dev/null || cp "${out}" "${bin_dir}/${name}"
	fi
}

print() {
	local missing=0 name
	for name in kube-apiserver etcd; do
		if [[ -x ${bin_dir}/${name} ]]; then
			echo "${name}: ${bin_dir}/${name}"
		else
			echo "${name}: missing from ${bin_dir}" >&2
			missing=1
		fi
	done
	echo "cache: ${cache_root}"
	return "${missing}"
}

case ${1:-} in
--print)
	print
	exit
	;;
"") ;;
*)
	echo "usage: $0 [--print]" >&2
	exit 2
	;;
esac

build etcd "${etcd_version}" "${here}/etcd" go.etcd.io/etcd/server/v3 "${etcd_ldflags}"
build kube-apiserver "${kube_version}" "${here}/apiserver" k8s.io/kubernetes/cmd/kube-apiserver "${kube_ldflags}"
print
