package kubesource_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/kubesource"
	"github.com/moat-net/moat/kubesource/kubesourcetest"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// TestAgainstAPIServer puts the quickstart example into a real
// kube-apiserver and checks that what Moat lists from it (page by page)
// judges every flow exactly as the same manifests read as files, that a
// policy holding fields Moat does not know fails closed with the same
// diagnostics as in a file, and that a user who may not list is refused.
func TestAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(kubetest.CRDWithNewerFields(t)))
	const dir = "../examples/quickstart"
	if err := kubesourcetest.ApplyFiles(ctx, env, dir+"/cluster.yaml", dir+"/policy.yaml"); err != nil {
		t.Fatal(err)
	}

	snap, err := kubesource.List(ctx, env.Config(), kubesource.Options{PageSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	live := snap.Result
	files, err := (&manifest.Loader{}).Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(live.Dropped) > 0 || len(live.Diagnostics) != len(files.Diagnostics) {
		t.Errorf("live: dropped %v, diagnostics %v; files: %v", live.Dropped, live.Diagnostics, files.Diagnostics)
	}
	// The server adds the default namespace and kube-system, kube-public,
	// kube-node-lease; Moat's pods and policies are the example's.
	if len(live.Cluster.Pods) != len(files.Cluster.Pods) || len(live.Cluster.Nodes) != len(files.Cluster.Nodes) ||
		len(live.Cluster.NetworkPolicies) != len(files.Cluster.NetworkPolicies) ||
		len(live.Cluster.ClusterNetworkPolicies) != len(files.Cluster.ClusterNetworkPolicies) {
		t.Fatalf("live %d pods %d nodes %d NPs %d CNPs; files %d %d %d %d",
			len(live.Cluster.Pods), len(live.Cluster.Nodes), len(live.Cluster.NetworkPolicies), len(live.Cluster.ClusterNetworkPolicies),
			len(files.Cluster.Pods), len(files.Cluster.Nodes), len(files.Cluster.NetworkPolicies), len(files.Cluster.ClusterNetworkPolicies))
	}
	if got, want := table(t, live), table(t, files); got != want {
		t.Errorf("live matrix differs from the files' matrix\nlive:\n%s\nfiles:\n%s", got, want)
	}

	// A policy written for a newer API: the server stores it (its CRD has
	// the fields), Moat fails closed on it exactly as on the file.
	const newer = "../examples/unknown-field-fail-closed/policy.yaml"
	if err := kubesourcetest.ApplyFiles(ctx, env, newer); err != nil {
		t.Fatal(err)
	}
	snap, err = kubesource.List(ctx, env.Config(), kubesource.Options{})
	if err != nil {
		t.Fatal(err)
	}
	live = snap.Result
	fromFile, err := (&manifest.Loader{}).Load(newer)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cnpErrors(live, "allow-icmp", "deny-by-service-account"), cnpErrors(fromFile, "allow-icmp", "deny-by-service-account"); got != want || !strings.Contains(got, "spec.ingress[0].from[0].serviceAccounts: unknown field") {
		t.Errorf("newer fields, live:\n%s\nfile:\n%s", got, want)
	}

	// Someone who may not list pods and policies cluster-wide is refused,
	// not given a partial snapshot.
	user, err := env.UserConfig(kubetest.UnprivilegedUser)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubesource.List(ctx, user, kubesource.Options{}); err == nil || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("unprivileged list: %v", err)
	}
}

func table(t *testing.T, res *manifest.Result) string {
	t.Helper()
	prog := policy.Compile(&res.Cluster, policy.Options{})
	m, err := matrix.Build(prog, matrix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := matrix.WriteTable(&b, m); err != nil {
		t.Fatal(err)
	}
	// Explanations too, not only verdicts.
	for _, f := range m.Flows {
		b.WriteString(f.Egress.Reason + " | " + f.Ingress.Reason + "\n")
	}
	return b.String()
}

// cnpErrors lists the compile and decode errors about the named
// ClusterNetworkPolicies, without their sources.
func cnpErrors(res *manifest.Result, names ...string) string {
	prog := policy.Compile(&res.Cluster, policy.Options{})
	var lines []string
	for _, d := range append(res.Diagnostics, prog.Diagnostics...) {
		for _, n := range names {
			if strings.HasPrefix(d.Object, "ClusterNetworkPolicy "+n) {
				d.Source = ""
				lines = append(lines, d.String())
			}
		}
	}
	return strings.Join(lines, "\n")
}

// A real API server without the ClusterNetworkPolicy CRD answers its list
// with 404 (an empty body, no Status) and its discovery does not list the
// group: the kind is not served, which is no error (the snapshot says so).
func TestClusterNetworkPoliciesNotServed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	env := kubetest.Start(ctx, t)
	snap, err := kubesource.List(ctx, env.Config(), kubesource.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.NotServed) != 1 || snap.NotServed[0] != "ClusterNetworkPolicy" {
		t.Errorf("not served: %v", snap.NotServed)
	}
}
