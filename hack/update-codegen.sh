#!/usr/bin/env bash
# Regenerates everything derived from the ClusterNetworkPolicy Go types in
# api/v1alpha2:
#   api/v1alpha2/zz_generated.deepcopy.go        controller-gen object
#   deploy/crds/{standard,experimental}/*.yaml   hack/tools/crdgen (controller-tools)
#   api/client/{applyconfiguration,clientset,listers,informers}
#                                                k8s.io/code-generator
#
# The generators are pinned in the nested module hack/tools (go.mod) and
# built from the Go module proxy; nothing else needs to be installed.
#
# Usage: hack/update-codegen.sh [--out DIR]
#   --out DIR  write the generated files under DIR (same relative layout)
#              instead of into the repository; used by hack/verify-codegen.sh
#              and the staleness test in api/v1alpha2.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${ROOT}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "update-codegen.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

MODULE="github.com/moat-net/moat"
API_PKG="${MODULE}/api/v1alpha2"
CLIENT_PKG="${MODULE}/api/client"
HEADER="${ROOT}/hack/tools/boilerplate.go.txt"

# Build the pinned tools once per invocation; Go's build cache makes
# repeated builds cheap.
BIN="$(mktemp -d)"
trap 'rm -rf "${BIN}"' EXIT
echo "building generators from hack/tools/go.mod" >&2
(
  cd "${ROOT}/hack/tools"
  GOFLAGS=-mod=readonly GOWORK=off go build -o "${BIN}/" \
    sigs.k8s.io/controller-tools/cmd/controller-gen \
    k8s.io/code-generator/cmd/applyconfiguration-gen \
    k8s.io/code-generator/cmd/client-gen \
    k8s.io/code-generator/cmd/lister-gen \
    k8s.io/code-generator/cmd/informer-gen \
    ./crdgen
)

cd "${ROOT}"
# The generators load api/v1alpha2 through the main module.
export GOWORK=off

echo "deepcopy" >&2
mkdir -p "${OUT}/api/v1alpha2"
"${BIN}/controller-gen" object:headerFile="${HEADER}" paths=./api/v1alpha2/... \
  output:object:dir="${OUT}/api/v1alpha2"

echo "CRDs (standard, experimental)" >&2
rm -rf "${OUT}/deploy/crds/standard" "${OUT}/deploy/crds/experimental"
"${BIN}/crdgen" -out "${OUT}/deploy/crds" ./api/v1alpha2

echo "applyconfigurations, clientset, listers, informers" >&2
rm -rf "${OUT}/api/client"
"${BIN}/applyconfiguration-gen" \
  --go-header-file "${HEADER}" \
  --output-dir "${OUT}/api/client/applyconfiguration" \
  --output-pkg "${CLIENT_PKG}/applyconfiguration" \
  "${API_PKG}"
"${BIN}/client-gen" \
  --go-header-file "${HEADER}" \
  --clientset-name versioned \
  --input-base "${MODULE}" \
  --input api/v1alpha2 \
  --apply-configuration-package "${CLIENT_PKG}/applyconfiguration" \
  --output-dir "${OUT}/api/client/clientset" \
  --output-pkg "${CLIENT_PKG}/clientset"
"${BIN}/lister-gen" \
  --go-header-file "${HEADER}" \
  --output-dir "${OUT}/api/client/listers" \
  --output-pkg "${CLIENT_PKG}/listers" \
  "${API_PKG}"
"${BIN}/informer-gen" \
  --go-header-file "${HEADER}" \
  --versioned-clientset-package "${CLIENT_PKG}/clientset/versioned" \
  --listers-package "${CLIENT_PKG}/listers" \
  --output-dir "${OUT}/api/client/informers" \
  --output-pkg "${CLIENT_PKG}/informers" \
  "${API_PKG}"
echo "done" >&2
