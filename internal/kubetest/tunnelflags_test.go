package kubetest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestTunnelFlagsPublishKubernetesEndpoints: kube-apiserver started with
// the flags of deploy/tunnel/kube-apiserver-flags.txt (those that name no
// file or port of a real host) publishes its advertise address 10.0.0.1 as
// the endpoint of the `kubernetes` Service, which is what KEP-2025 set-up
// relies on (docs/tunnel.md). With --endpoint-reconciler-type=none, which
// the file carried before, no EndpointSlice is written at all and every
// in-cluster client loses the API server.
func TestTunnelFlagsPublishKubernetesEndpoints(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy/tunnel/kube-apiserver-flags.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "=")
		// The test server has its own port, and no egress selector
		// configuration on disk: the rest is taken as shipped.
		if name == "--secure-port" || name == "--egress-selector-config-file" {
			continue
		}
		flags = append(flags, line)
	}
	if !slices.Contains(flags, "--advertise-address=10.0.0.1") {
		t.Fatalf("kube-apiserver-flags.txt no longer advertises 10.0.0.1: %v; update this test", flags)
	}
	ctx := context.Background()
	// The test harness turns the reconciler off for its loopback
	// address; without the flag in the file, a real host runs
	// kube-apiserver's default, lease, which is put back here. The file's
	// flags come after the harness's and win.
	if !slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "--endpoint-reconciler-type=") }) {
		flags = append(flags, "--endpoint-reconciler-type=lease")
	}
	env := Start(ctx, t, WithAPIServerArgs(flags...))
	var got []string
	// The reconciler writes the slice shortly after start; the deadline
	// is only a bound for a broken set-up, not a measurement.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := env.Client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = got[:0]
		for _, e := range s.Endpoints {
			got = append(got, e.Addresses...)
		}
		return slices.Contains(got, "10.0.0.1"), nil
	})
	if err != nil {
		t.Fatalf("EndpointSlice default/kubernetes holds %v, want 10.0.0.1: %v", got, err)
	}
}
