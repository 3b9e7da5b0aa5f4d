package netns

import (
	"context"
	"net"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/internal/netns/netnstest"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// hairpinNAT is what kube-proxy does for a ClusterIP Service whose one
// endpoint is pod p: DNAT of the ClusterIP in prerouting and, when the
// pod reaches itself through it, masquerade in postrouting (hairpin
// mode), so the reply comes back through the node.
const hairpinNAT = `table ip moat-test-nat {
	chain pre { type nat hook prerouting priority -100; ip daddr 10.96.0.10 tcp dport 80 dnat to 10.244.0.5:80; }
	chain post { type nat hook postrouting priority 100; ip saddr 10.244.0.5 ip daddr 10.244.0.5 masquerade; }
}
`

// The policies TestServiceHairpin programs beside pod p (app: p).
const (
	hairpinAdminDeny = `---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-p-ingress}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: p}}}}
  ingress:
  - {action: Deny, from: [{namespaces: {}}]}
`
	hairpinBaselineDeny = `---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-deny-p-egress}
spec:
  tier: Baseline
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: p}}}}
  egress:
  - {action: Deny, to: [{pods: {namespaceSelector: {}, podSelector: {}}}]}
`
	// hairpinIsolate isolates the pod both ways; it may send the
	// test's marker to the node.
	hairpinIsolate = `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.244.0.1/32}}]
    ports: [{protocol: UDP, port: 9998}]
`
)

// TestServiceHairpin: pod p reaches a ClusterIP whose
// proxy sends the connection back to p. Upstream: such a connection "is
// subject to ClusterNetworkPolicy", while a pod cannot block access to
// itself with NetworkPolicy. So an Admin Deny drops it (before, dispatch
// accepted every pod-to-itself packet before any tier), a Baseline Deny
// drops it when no NetworkPolicy selects the pod, and NetworkPolicies
// that isolate the pod, with or without that Baseline Deny, let it
// through, as does no policy at all. Each case agrees with
// Program.HairpinAllowed.
func TestServiceHairpin(t *testing.T) {
	testenv.RequirePrivileged(t)
	if !netnstest.Isolate(t) {
		return
	}
	l := newSpoofLab(t, "moat-hp-")
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.rp0.rp_filter", "net.ipv4.conf.all.send_redirects", "net.ipv4.conf.rp0.send_redirects"} {
		if err := l.r.Sysctl(k, "0"); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := nftIn(l.r, hairpinNAT); err != nil {
		t.Fatalf("nat table: %v: %s", err, out)
	}
	dp, err := l.r.Dataplane(nft.Options{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	ln := listenTCP(t, l.p, "tcp4", net.TCPAddr{Port: 80})
	marker := listen(t, l.r, "udp", 9998)[0]
	cluster := spoofNode + namespaceA + podPV4
	for _, c := range []struct {
		name, policies string
		allowed        bool
	}{
		{"Admin Deny", hairpinAdminDeny, false},
		{"no policy", "", true},
		{"NetworkPolicy isolation", hairpinIsolate, true},
		{"Baseline Deny", hairpinBaselineDeny, false},
		{"Baseline Deny under NetworkPolicy isolation", hairpinBaselineDeny + hairpinIsolate, true},
		{"Admin Deny under NetworkPolicy isolation", hairpinAdminDeny + hairpinIsolate, false},
	} {
		prog := compile(t, cluster+c.policies, policy.Options{})
		if _, err := dp.Sync(context.Background(), prog); err != nil {
			t.Fatal(err)
		}
		pi, _ := prog.PodByKey("a/p")
		p := policy.Endpoint{Pod: pi, Addr: prog.Pods[pi].IPs[0]}
		if got := prog.HairpinAllowed(policy.Flow{Src: p, Dst: p, Proto: policy.ProtoTCP, Port: 80}); got != c.allowed {
			t.Errorf("%s: HairpinAllowed = %v, want %v", c.name, got, c.allowed)
		}
		if c.allowed {
			dial(t, l.p, "10.96.0.10:80").Close()
			if conn, ok := acceptNow(t, ln); ok {
				conn.Close()
			}
			continue
		}
		before := dropped(t, dp, nft.ReasonDeny)
		// The SYN through the Service, then a datagram to the node on the
		// same path: when it arrives, the SYN has been judged.
		fd := startConnect(t, l.p, [4]byte{10, 96, 0, 10}, 80)
		send(t, l.p, ap("10.244.0.5:40000"), ap("10.244.0.1:9998"), "marker")
		receiveUntil(t, marker)
		unix.Close(fd)
		if n := dropped(t, dp, nft.ReasonDeny); n <= before {
			t.Errorf("%s: the hairpin SYN was not dropped by the Deny rule", c.name)
		}
		if conn, ok := acceptNow(t, ln); ok {
			conn.Close()
			t.Errorf("%s: the pod reached itself through the Service", c.name)
		}
	}
}
