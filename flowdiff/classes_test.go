package flowdiff

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// classBase is a small dual-stack cluster: two nodes, pods declaring
// ports (c only 443), a host-network pod on node-a's addresses and a pod
// declaring none.
const classBase = `apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {zone: a}}
status: {addresses: [{type: InternalIP, address: 192.0.2.11}, {type: InternalIP, address: "2001:db8::11"}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-b, labels: {zone: b}}
status: {addresses: [{type: InternalIP, address: 192.0.2.12}, {type: InternalIP, address: "2001:db8::12"}]}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns1, labels: {team: one}}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns2}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: ns1, labels: {app: a}}
spec:
  nodeName: node-a
  containers: [{name: c, image: x, ports: [{name: web, containerPort: 80}, {name: dns, containerPort: 53, protocol: UDP}]}]
status: {podIPs: [{ip: 10.244.1.10}, {ip: "fd00:1::10"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: ns2, labels: {app: c}}
spec:
  nodeName: node-b
  containers: [{name: c, image: x, ports: [{name: web, containerPort: 443}]}]
status: {podIPs: [{ip: 10.244.2.30}, {ip: "fd00:2::30"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: h, namespace: ns2, labels: {app: h}}
spec:
  nodeName: node-a
  hostNetwork: true
  containers: [{name: c, image: x, ports: [{name: web, containerPort: 9100}]}]
status: {podIPs: [{ip: 192.0.2.11}, {ip: "2001:db8::11"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: quiet, namespace: ns2, labels: {app: quiet}}
spec: {nodeName: node-b, containers: [{name: c, image: x}]}
status: {podIPs: [{ip: 10.244.2.44}]}
`

// cIngress is a NetworkPolicy on pod c with the given ingress rules.
func cIngress(rules string) string {
	return `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c-in, namespace: ns2}
spec:
  podSelector: {matchLabels: {app: c}}
  policyTypes: [Ingress]
  ingress: ` + rules + "\n"
}

// compileYAML compiles documents as `moat diff` reads them.
func compileYAML(t testing.TB, docs ...string) *policy.Program {
	t.Helper()
	fsys := fstest.MapFS{}
	for i, d := range docs {
		fsys[fmt.Sprintf("%02d.yaml", i)] = &fstest.MapFile{Data: []byte(d)}
	}
	res, err := (&manifest.Loader{FS: fsys}).Load(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) > 0 {
		t.Fatalf("dropped: %v", res.Dropped)
	}
	return policy.Compile(&res.Cluster, policy.Options{IngressNetworksAndNodes: true})
}

// line is a change as the table prints it, without the explanations.
func line(c Change) string {
	return fmt.Sprintf("%s -> %s %s %v->%v", c.From, c.To, portOf(c), c.Before.Allowed, c.After.Allowed)
}

// TestDefaultProbesFindEveryChange: without --port, changes on ports no
// pod declares, to pods declaring none, of other protocols and to
// addresses no --peer names are found, each shown with the ports or
// addresses it stands for; and every port and address the probes stand
// for is judged alike (checked port by port).
func TestDefaultProbesFindEveryChange(t *testing.T) {
	cnp := func(rule string) string {
		return `apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: no-internet}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - ` + rule + "\n"
	}
	ipBlock := func(except string) string {
		return cIngress(`[{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [` + except + `]}}]}]`)
	}
	for _, tc := range []struct {
		name          string
		before, after []string
		want          []string // lines that must be among the changes
		none          bool     // no change at all
	}{
		{
			// Pod c declares only 443.
			name:   "isolating rule opened to all ports",
			before: []string{cIngress(`[{ports: [{port: 443}]}]`)},
			after:  []string{cIngress(`[{}]`)},
			want: []string{
				"ns1/a -> ns2/c 1/TCP (any port or protocol but TCP 443) IPv4 false->true",
				"ns1/a -> ns2/c 1/TCP (any port or protocol but TCP 443) IPv6 false->true",
				"ns1/a -> ns2/c 443/TCP IPv4 true->true",
				"0.0.0.0/0 -> ns2/c 1/TCP (any port or protocol but TCP 443) false->true",
			},
		},
		{
			name:   "isolating policy deleted",
			before: []string{cIngress(`[{ports: [{port: 443}]}]`)},
			want:   []string{"ns1/a -> ns2/c 1/TCP (any port or protocol but TCP 443) IPv4 false->true"},
		},
		{
			// No pod or --peer is in the CIDR.
			name:   "Admin deny of a network deleted",
			before: []string{cnp(`{action: Deny, to: [{networks: [198.51.100.0/24]}]}`)},
			want:   []string{"ns1/a -> 198.51.100.0/24 1/TCP (any port or protocol) false->true"},
		},
		{
			name:   "except hole narrowed",
			before: []string{ipBlock("10.1.0.0/16")},
			after:  []string{ipBlock("10.1.0.0/17")},
			want:   []string{"10.1.128.0/17 -> ns2/c 443/TCP (any port or protocol) false->true"},
		},
		{
			name:   "port range narrowed at the start",
			before: []string{cIngress(`[{ports: [{port: 8000, endPort: 9000}]}]`)},
			after:  []string{cIngress(`[{ports: [{port: 8001, endPort: 9000}]}]`)},
			want:   []string{"ns1/a -> ns2/c 8000/TCP IPv4 true->false", "192.0.2.12 (node node-b) -> ns2/c 8000/TCP true->true"},
		},
		{
			name:   "port range narrowed at the end",
			before: []string{cIngress(`[{ports: [{port: 8000, endPort: 9000}]}]`)},
			after:  []string{cIngress(`[{ports: [{port: 8000, endPort: 8999}]}]`)},
			want:   []string{"ns1/a -> ns2/c 9000/TCP IPv6 true->false"},
		},
		{
			name:   "two ports of one rule narrowed to one",
			before: []string{cIngress(`[{ports: [{port: 80}, {port: 443}]}, {ports: [{port: 8080}]}]`)},
			after:  []string{cIngress(`[{ports: [{port: 443}]}, {ports: [{port: 8080}]}]`)},
			want: []string{
				"ns1/a -> ns2/c 80/TCP IPv4 true->false",
				"ns1/a -> ns2/c 443/TCP (any of 80, 443) IPv4 true->true",
			},
		},
		{
			name:   "protocol TCP to UDP",
			before: []string{cIngress(`[{ports: [{port: 53, protocol: TCP}]}]`)},
			after:  []string{cIngress(`[{ports: [{port: 53, protocol: UDP}]}]`)},
			want:   []string{"ns1/a -> ns2/c 53/TCP IPv4 true->false", "ns1/a -> ns2/c 53/UDP IPv4 false->true"},
		},
		{
			name:   "ICMP only",
			before: []string{cIngress(`[{ports: [{protocol: TCP}, {protocol: UDP}, {protocol: SCTP}]}]`)},
			after:  []string{cIngress(`[{}]`)},
			want:   []string{"ns1/a -> ns2/c ICMP (any protocol but TCP, UDP and SCTP) IPv4 false->true"},
		},
		{
			name: "pod declaring no ports",
			before: []string{`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: quiet-deny, namespace: ns2}
spec:
  podSelector: {matchLabels: {app: quiet}}
  policyTypes: [Ingress, Egress]
`},
			want: []string{"ns1/a -> ns2/quiet 1/TCP (any port or protocol) false->true", "ns2/quiet -> ns1/a 80/TCP (any port or protocol) false->true"},
		},
		{
			name: "nodes peer deleted",
			before: []string{`apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: no-node-b}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {team: one}}}
  ingress:
  - {action: Deny, from: [{nodes: {matchLabels: {zone: b}}}]}
`},
			want: []string{
				"192.0.2.12 (node node-b) -> ns1/a 80/TCP (any port or protocol) false->true",
				"2001:db8::12 (node node-b) -> ns1/a 80/TCP (any port or protocol) false->true",
				"ns2/h -> ns1/a 80/TCP (any port or protocol) IPv4 true->true",
			},
		},
		{
			name:   "no change",
			before: []string{ipBlock("10.1.0.0/16")},
			after:  []string{ipBlock("10.1.0.0/16")},
			none:   true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := compileYAML(t, append([]string{classBase}, tc.before...)...)
			after := compileYAML(t, append([]string{classBase}, tc.after...)...)
			if len(tc.after) == 0 {
				after = compileYAML(t, classBase)
			}
			got := Compute(before, after, Options{})
			lines := map[string]bool{}
			for _, c := range got.Changes {
				lines[line(c)] = true
			}
			for _, w := range tc.want {
				// A want line with equal verdicts is one that must not
				// be a change.
				if must := !strings.HasSuffix(w, "true->true"); lines[w] != must {
					t.Errorf("change %q: %v, want %v", w, lines[w], must)
				}
			}
			if tc.none != (len(got.Changes) == 0) {
				t.Errorf("%d changes", len(got.Changes))
			}
			if t.Failed() {
				for l := range lines {
					t.Log(l)
				}
			}
			checkPorts(t, before, after, Options{}, got, sampledPorts)
		})
	}
}

// allPorts and sampledPorts are the ports checkPorts judges of a port
// protocol: every one (TCP and UDP; SCTP is sampled, to keep the test
// short), or the ends of each class, the ports just outside them and a
// spread of others.
func allPorts(proto policy.Protocol, cls []portClass) []uint16 {
	if proto == policy.ProtoSCTP {
		return sampledPorts(proto, cls)
	}
	out := make([]uint16, 65535)
	for i := range out {
		out[i] = uint16(i + 1)
	}
	return out
}

func sampledPorts(_ policy.Protocol, cls []portClass) []uint16 {
	var out []uint16
	for _, c := range cls {
		for _, r := range c.ranges {
			out = append(out, r.from, r.to, max(r.from, 2)-1, min(r.to, 65534)+1)
		}
	}
	for p := 1; p <= 65535; p += 257 {
		out = append(out, uint16(p))
	}
	return out
}

// checkPorts judges, for every pair of endpoints the diff compares (pods,
// --peer and implied peers) with a policed pod at one end, the ports
// ports gives of TCP, UDP and SCTP, and ICMP, in both states, and checks
// that the probes hide nothing: every port of a class judges alike within
// each state, and the class's probe is reported as a change exactly when
// the verdict differs.
func checkPorts(t *testing.T, before, after *policy.Program, opts Options, got *Result, ports func(policy.Protocol, []portClass) []uint16) {
	t.Helper()
	s := newSpace(before, after, opts)
	reported := map[string]bool{}
	for _, c := range got.Changes {
		reported[fmt.Sprintf("%s|%s|%d/%s|%s", c.From, c.To, c.Port, c.Protocol, c.Family)] = true
	}
	type pair struct{ src, dst int }
	var pairs []pair
	for i := range s.eps {
		for j := range s.eps {
			if policed(s, i) || policed(s, j) {
				pairs = append(pairs, pair{i, j})
			}
		}
	}
	var (
		mu       sync.Mutex
		problems []string
		changed  int
		wg       sync.WaitGroup
	)
	work := make(chan pair)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range work {
				ps, n := checkPair(s, p.src, p.dst, reported, ports)
				mu.Lock()
				problems = append(problems, ps...)
				changed += n
				mu.Unlock()
			}
		}()
	}
	for _, p := range pairs {
		work <- p
	}
	close(work)
	wg.Wait()
	for i, p := range problems {
		if i == 20 {
			t.Errorf("and %d more", len(problems)-i)
			break
		}
		t.Error(p)
	}
	if (changed == 0) != (len(got.Changes) == 0) {
		t.Errorf("port by port %d flows change, the diff lists %d changes", changed, len(got.Changes))
	}
}

// policed reports whether an endpoint is a pod policed in either state:
// a flow between two others is allowed in both.
func policed(s *space, e int) bool {
	ep := &s.eps[e]
	return ep.pod && (s.before.Policies[ep.podBefore] != nil || s.after.Policies[ep.podAfter] != nil)
}

// checkPair checks one pair; it returns the problems found and how many
// (family, protocol, port) flows change.
func checkPair(s *space, src, dst int, reported map[string]bool, ports func(policy.Protocol, []portClass) []uint16) ([]string, int) {
	from, to := &s.eps[src], &s.eps[dst]
	cls := s.classes.classes(from.egress, to.ingress)
	var problems []string
	changed := 0
	families := 0
	var fps [2]struct {
		b, a     [2]policy.Endpoint
		okB, okA bool
	}
	for f, v4 := range []bool{true, false} {
		fp := &fps[f]
		fp.b, fp.okB = s.before.PairAddrsIn(from.before.Endpoint, to.before.Endpoint, v4)
		fp.a, fp.okA = s.after.PairAddrsIn(from.after.Endpoint, to.after.Endpoint, v4)
		if fp.okB || fp.okA {
			families++
		}
	}
	for f := range fps {
		fp := &fps[f]
		if !fp.okB && !fp.okA {
			continue
		}
		family := ""
		if families > 1 {
			family = [2]string{"IPv4", "IPv6"}[f]
		}
		// The verdicts (before, after) seen so far in each class.
		seen := make([]int8, len(cls))
		judge := func(proto policy.Protocol, port uint16) {
			b := fp.okB && s.before.Allowed(policy.Flow{Src: fp.b[0], Dst: fp.b[1], Proto: proto, Port: port})
			a := fp.okA && s.after.Allowed(policy.Flow{Src: fp.a[0], Dst: fp.a[1], Proto: proto, Port: port})
			if a != b {
				changed++
			}
			k := classOf(cls, proto, port)
			v := int8(1)
			if b {
				v |= 2
			}
			if a {
				v |= 4
			}
			switch {
			case seen[k] == 0:
				seen[k] = v
				probe := cls[k].probe(to.decl)
				key := fmt.Sprintf("%s|%s|%d/%s|%s", from.label, to.label, probe.Port, probe.Protocol, family)
				if reported[key] != (a != b) {
					problems = append(problems, fmt.Sprintf("%s -> %s %s %s: class %q changes %v, reported %v", from.label, to.label, family, matrix.PortProto{Port: port, Protocol: proto}, cls[k].describe(), a != b, reported[key]))
				}
			case seen[k] != v:
				problems = append(problems, fmt.Sprintf("%s -> %s %s %d/%s: judged unlike the rest of its class %q", from.label, to.label, family, port, proto, cls[k].describe()))
				seen[k] = v
			}
		}
		for _, proto := range policy.PortProtocols {
			for _, port := range ports(proto, cls) {
				judge(proto, port)
			}
		}
		judge(policy.ProtoICMP, 0)
	}
	return problems, changed
}

// classOf finds the class of a protocol and port.
func classOf(cls []portClass, proto policy.Protocol, port uint16) int {
	for i := range cls {
		if cls[i].contains(proto, port) {
			return i
		}
	}
	panic(fmt.Sprintf("%d/%s in no class", port, proto))
}

// TestProbesMatchEveryPort is the property behind the default probes, on
// random small clusters (internal/randcluster): the diff finds a change
// iff judging every TCP and UDP port 1-65535, ICMP and SCTP ports (the
// class ends and a spread) between every
// pair of its endpoints (pods, the scenario's peers, node addresses and
// the implied peers) finds one; and within each pair every port of a
// class is judged alike, so no change can hide between the probes. The
// proposed state keeps the cluster and changes its policies: none, one
// deleted, or all replaced by another scenario's.
func TestProbesMatchEveryPort(t *testing.T) {
	cfg := randcluster.Config{Nodes: 2, MinPods: 3, MaxPods: 4, Namespaces: 2, MaxNetworkPolicies: 3,
		MaxClusterPolicies: 2, HostNetworkPod: true, ExternalPeers: true, IPv6: true, MaxRulesPerDirection: 2}
	load := func(seed int64) *policy.Cluster {
		y, err := randcluster.Generate(seed, cfg).Manifests()
		if err != nil {
			t.Fatal(err)
		}
		res, err := (&manifest.Loader{Stdin: bytes.NewReader(y)}).Load("-")
		if err != nil {
			t.Fatal(err)
		}
		return &res.Cluster
	}
	seeds := []int64{1, 2, 3}
	if testing.Short() {
		seeds = seeds[1:2]
	}
	changed := 0
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			c := load(seed)
			next := *c
			switch seed % 3 {
			case 1:
				if n := len(c.NetworkPolicies); n > 0 {
					next.NetworkPolicies = c.NetworkPolicies[:n-1]
				} else if n := len(c.ClusterNetworkPolicies); n > 0 {
					next.ClusterNetworkPolicies = c.ClusterNetworkPolicies[:n-1]
				}
			case 2:
				other := load(seed + 1000)
				next.NetworkPolicies, next.ClusterNetworkPolicies = other.NetworkPolicies, other.ClusterNetworkPolicies
			}
			opts := policy.Options{IngressNetworksAndNodes: true}
			before, after := policy.Compile(c, opts), policy.Compile(&next, opts)
			dopts := Options{Peers: []netip.Addr{randcluster.Peer4, randcluster.Peer6}}
			got := Compute(before, after, dopts)
			if full := Full(before, after, dopts); len(full.Changes) != len(got.Changes) {
				t.Errorf("Compute found %d changes, Full %d", len(got.Changes), len(full.Changes))
			}
			if len(got.Changes) > 0 {
				changed++
			}
			checkPorts(t, before, after, dopts, got, allPorts)
		})
	}
	if changed == 0 {
		t.Errorf("no seed changed a verdict: the property was not exercised")
	}
}
