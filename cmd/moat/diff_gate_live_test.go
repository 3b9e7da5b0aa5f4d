package main

import (
	"context"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/moat-net/moat/deploy"
	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/kubesource/kubesourcetest"
)

// liveQuickstart starts a real kube-apiserver holding the quickstart and
// returns a kubeconfig whose context "moat-test" has namespace ns (none
// if ns is empty).
func liveQuickstart(t *testing.T, ns string) (*kubetest.Env, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; runs without -short")
	}
	ctx := context.Background()
	crds, err := deploy.CRDs(deploy.Experimental)
	if err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(ctx, t, kubetest.WithCRDs(crds))
	if err := kubesourcetest.ApplyFiles(ctx, env, quickstart+"/cluster.yaml", quickstart+"/policy.yaml"); err != nil {
		t.Fatal(err)
	}
	kc, err := kubesourcetest.WriteKubeconfig(env, t.TempDir(), "moat-test")
	if err != nil {
		t.Fatal(err)
	}
	if ns == "" {
		return env, kc
	}
	cfg, err := clientcmd.LoadFromFile(kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts["moat-test"].Namespace = ns
	if err := clientcmd.WriteToFile(*cfg, kc); err != nil {
		t.Fatal(err)
	}
	return env, kc
}

// kubectl apply puts an object without a
// namespace in the kubeconfig context's namespace, and so does moat diff
// --live; -n overrides it, as with kubectl.
func TestDiffGateLiveNamespace(t *testing.T) {
	_, kc := liveQuickstart(t, "backend")
	out, errOut, code := run(t, denyNoNamespace, "diff", "--kubeconfig", kc, "--after", "-")
	if code != exitChanged || !strings.HasPrefix(out, "13 of ") || !strings.Contains(out, "backend/deny-all") {
		t.Errorf("context namespace backend: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	if strings.Contains(errOut, "metadata.namespace") {
		t.Errorf("placed as kubectl places it, yet warned: %q", errOut)
	}
	// -n wins over the context; an object naming another namespace is
	// refused.
	out, errOut, code = run(t, denyNoNamespace, "diff", "--kubeconfig", kc, "-n", "monitoring", "--after", "-")
	if code != exitChanged || !strings.Contains(out, "monitoring/deny-all") || strings.Contains(out, "backend/deny-all") {
		t.Errorf("-n monitoring: code %d, stderr %q, out:\n%s", code, errOut, out)
	}
	_, errOut, code = run(t, denyBackend, "diff", "--kubeconfig", kc, "-n", "monitoring", "--after", "-")
	if code != 1 || !strings.Contains(errOut, `the namespace from the provided object "backend" does not match the namespace "monitoring"`) {
		t.Errorf("-n monitoring, object in backend: code %d, stderr %q", code, errOut)
	}
	// -f layered on the cluster is an apply too.
	_, errOut, code = run(t, denyNoNamespace, "check", "--kubeconfig", kc, "-f", "-")
	if code != 0 || !strings.Contains(errOut, "(objects without a namespace in backend, the kubeconfig context's)") {
		t.Errorf("check -f on the cluster: code %d, stderr %q", code, errOut)
	}
}
