# Sourced by hack/*.sh entry points that need root (network namespaces,
# nftables, the privileged tests): run_as_root re-runs the calling script
# through sudo when it is not root, so the README's commands work for a
# user with sudo on a fresh machine.
#
# How the re-run is made, and why:
#   - the script is re-run by its absolute path, so it works from any
#     working directory (the script cds to the repository itself);
#   - sudo -H gives root its own HOME, so Go's build and module caches
#     (and hack/kube/build.sh's cache) under sudo are root's own
#     (/root/.cache/go-build, /root/go/pkg/mod), never root-owned files in
#     the user's caches that the user's next go build could not write;
#   - PATH is passed with `env`, after sudo, so the user's `go` is found
#     even where sudo's secure_path (Debian, Ubuntu) leaves out
#     /usr/local/go/bin or ~/go/bin;
#   - the user's Go settings (also those set with go env -w, which live
#     under the user's HOME) are passed as variables: proxy, checksum
#     database, private modules, toolchain, flags;
#   - CI passes through, so a CI job that uses sudo keeps its rule.

# run_as_root SCRIPT ARGS... returns when already root; otherwise it
# replaces the shell with `sudo ... bash SCRIPT ARGS...`, or exits 1 saying
# how to run SCRIPT when sudo is missing.
run_as_root() {
	local script
	script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
	shift
	[[ $(id -u) -eq 0 ]] && return 0
	if ! command -v sudo >/dev/null 2>&1; then
		echo "${script}: needs root (network namespaces, nftables) and sudo is not installed: run it as root" >&2
		exit 1
	fi
	local vars=("PATH=${PATH}") v val
	for v in GOPROXY GOSUMDB GOPRIVATE GONOPROXY GONOSUMDB GOINSECURE GOTOOLCHAIN GOFLAGS; do
		val=$(go env "${v}" 2>/dev/null) || val=
		[[ -n ${val} ]] && vars+=("${v}=${val}")
	done
	[[ -n ${CI:-} ]] && vars+=("CI=${CI}")
	echo "${script}: not root: re-running with sudo (root's own Go caches under its HOME)" >&2
	exec sudo -H env "${vars[@]}" bash "${script}" "$@"
}
