#!/usr/bin/env bash
# Fails when the committed generated files (deepcopy, CRDs, clientset,
# listers, informers) differ from what hack/update-codegen.sh produces now.
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "${TMP}"' EXIT

"${ROOT}/hack/update-codegen.sh" --out "${TMP}"

status=0
for path in api/v1alpha2/zz_generated.deepcopy.go deploy/crds/standard deploy/crds/experimental api/client; do
  if ! diff -r -u "${ROOT}/${path}" "${TMP}/${path}"; then
    status=1
  fi
done
if [[ ${status} -ne 0 ]]; then
  echo "generated files are stale: run hack/update-codegen.sh and commit the result" >&2
else
  echo "generated files are up to date" >&2
fi
exit "${status}"
