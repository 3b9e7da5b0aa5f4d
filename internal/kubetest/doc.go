// Package kubetest runs a real etcd and kube-apiserver on loopback for
// integration tests, so that Moat's agent, RBAC and manifests are checked
// against the same server a cluster runs rather than a fake.
//
// The binaries are built from the Go module proxy by hack/kube/build.sh and
// found through MOAT_KUBE_APISERVER / MOAT_ETCD, the repository's bin/, or the
// build cache, in that order. When they are missing, Start skips the test
// with a message saying how to build them, except when CI=true, where a
// missing binary fails the test: CI must never pass by skipping.
//
// The server runs with RBAC (and the Node authorizer), a token file holding an
// admin (system:masters) user and an unprivileged user, self-signed serving
// certificates the client verifies, a service-account signing key (so
// TokenRequest works), the ServiceAccount admission plugin disabled (no
// controller manager creates "default" service accounts) and no endpoint
// reconciler. No kubelet runs: pods stay Pending until a test writes their
// status (SetPodIPs), and namespace deletion never completes.
package kubetest
