# Sourced by hack/*.sh: installs Debian packages when their commands are
# missing, so every entry point works on a fresh machine that has only Go.

# ensure_packages CMD:PKG... installs PKG for each CMD not on PATH.
ensure_packages() {
	local missing=() pair cmd pkg
	for pair in "$@"; do
		cmd=${pair%%:*}
		pkg=${pair#*:}
		command -v "${cmd}" >/dev/null 2>&1 || missing+=("${pkg}")
	done
	[[ ${#missing[@]} -eq 0 ]] && return 0
	local sudo=()
	if [[ $(id -u) -ne 0 ]]; then
		if ! command -v sudo >/dev/null 2>&1; then
			echo "missing packages ${missing[*]} and not root: install them or run as root" >&2
			return 1
		fi
		sudo=(sudo)
	fi
	echo "installing ${missing[*]} (apt-get)" >&2
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
