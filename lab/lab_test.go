package lab

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

func compileFile(t testing.TB, name string, opts policy.Options) *policy.Program {
	t.Helper()
	res, err := (&manifest.Loader{}).Load(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	return policy.Compile(&res.Cluster, opts)
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// leftovers fails the test if namespaces with the prefix survive.
func leftovers(t *testing.T, prefix string) {
	t.Helper()
	names, err := netns.List(prefix + "-")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) > 0 {
		t.Errorf("namespaces left behind: %v", names)
		for _, n := range names {
			_ = netns.Delete(n)
		}
	}
	if _, err := os.Stat(filepath.Join(stateRoot, prefix)); err == nil {
		t.Errorf("state of lab %s left behind", prefix)
		_ = os.RemoveAll(filepath.Join(stateRoot, prefix))
	}
}

func TestRunAgreesWithEvaluator(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("lab run: slow")
	}
	prefix, err := newName()
	if err != nil {
		t.Fatal(err)
	}
	defer leftovers(t, prefix)
	prog := compileFile(t, "tiers.yaml", policy.Options{IngressNetworksAndNodes: true})
	peers := addrs("203.0.113.7", "203.0.113.200", "198.51.100.1", "2001:db8::1", "192.168.0.2")
	rep, err := Run(context.Background(), prog, Options{Name: prefix, Peers: peers}, ProbeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	measured, allowed, denied := 0, 0, 0
	for _, f := range rep.Flows {
		if !f.Agree {
			t.Errorf("disagreement: %s -> %s %d/%s (%s -> %s): measured %v (%s), evaluator %v (egress: %s; ingress: %s)",
				f.From, f.To, f.Port, f.Protocol, f.SrcIP, f.DstIP, f.Allowed, f.Outcome, f.Predicted, f.Egress.Reason, f.Ingress.Reason)
		}
		if f.Measured {
			measured++
			if f.Allowed {
				allowed++
			} else {
				denied++
			}
		}
	}
	t.Logf("%d flows, %d measured (%d allowed, %d denied)", len(rep.Flows), measured, allowed, denied)
	if allowed == 0 || denied == 0 {
		t.Errorf("want both allowed and denied measured flows, got %d and %d", allowed, denied)
	}
}

func TestSCTPFlowsAreJudgedFromRules(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("lab run: slow")
	}
	prog := behaviour(t, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: sctp-from-client, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 3868, protocol: SCTP}]
`, policy.Options{})
	prefix, err := newName()
	if err != nil {
		t.Fatal(err)
	}
	defer leftovers(t, prefix)
	ports := []matrix.PortProto{{Port: 3868, Protocol: policy.ProtoSCTP}, {Port: 80, Protocol: policy.ProtoTCP}}
	rep, err := Run(context.Background(), prog, Options{Name: prefix, Ports: ports}, ProbeOptions{Timeout: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	allowed, denied := 0, 0
	for _, f := range rep.Flows {
		if !f.Agree {
			t.Errorf("disagreement: %s", describe(f))
		}
		if f.Protocol != "SCTP" {
			if !f.Measured {
				t.Errorf("TCP flow not measured: %s", describe(f))
			}
			continue
		}
		if f.Measured || !strings.Contains(f.Reason, "SCTP sockets are not available") {
			t.Errorf("SCTP flow: measured=%v reason=%q", f.Measured, f.Reason)
		}
		if f.To == "app/server" && f.From != "app/server" {
			if f.Allowed {
				allowed++
			} else {
				denied++
			}
		}
	}
	if allowed != 1 || denied != 2 {
		t.Errorf("SCTP to the server: %d allowed, %d denied; want 1 (client) and 2 (local, other)", allowed, denied)
	}
}
