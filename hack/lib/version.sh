# Sourced by hack/*.sh scripts that tag what they build with the version of
# this tree. The version is written once, as the Go constant deploy.Version
# (deploy/embed.go), which the manifests pin (TestManifestsPinTheVersion);
# moat_version reads it from there, so that images built here carry the tag
# the manifests name (TestBuildScriptsReadTheVersion checks the reading).

# moat_version prints deploy.Version; $1 is the repository's root.
moat_version() {
	local v
	v=$(sed -n 's/^const Version = "\([^"]*\)"$/\1/p' "$1/deploy/embed.go")
	if [[ -z ${v} ]]; then
		echo "hack/lib/version.sh: no 'const Version = \"...\"' line in $1/deploy/embed.go" >&2
		return 1
	fi
	printf '%s\n' "${v}"
}
