package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/policy"
)

// benchScenarios are the policies BenchmarkConnections compares. The
// client (node n-a) is allowed to reach the server (node n-b) on 80/TCP
// and 53/UDP in each, so every connection is judged and accepted.
func benchScenarios() []struct{ name, yaml string } {
	var np1000 strings.Builder
	for i := 0; i < 999; i++ {
		fmt.Fprintf(&np1000, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np-%d, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress:
  - from: [{ipBlock: {cidr: 10.%d.%d.0/24}}]
    ports: [{port: %d}]
---
`, i, 200+i/250, i%250, 1000+i)
	}
	np1000.WriteString(allowClient("np-client", "[{port: 80}, {port: 53, protocol: UDP}]"))

	var cnp200 strings.Builder
	for i := 0; i < 200; i++ {
		// Alternating actions keep the rules from sharing a lookup:
		// the worst case, 200 rules walked before the verdict.
		action := []string{"Deny", "Pass"}[i%2]
		fmt.Fprintf(&cnp200, `apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cnp-%03d}
spec:
  tier: Admin
  priority: %d
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: server}}}}
  ingress:
  - action: %s
    from: [{networks: ["10.%d.%d.0/24"]}]
---
`, i, i, action, 200+i/250, i%250)
	}
	return []struct{ name, yaml string }{
		{"none", ""},
		{"np=1000", np1000.String()},
		{"ports=1-65535", allowClient("wide", "[{port: 1, endPort: 65535}, {port: 1, endPort: 65535, protocol: UDP}]")},
		{"ports=single", allowClient("narrow", "[{port: 80}, {port: 53, protocol: UDP}]")},
		{"cnp=200", strings.TrimSuffix(cnp200.String(), "---\n")},
	}
}

func allowClient(name, ports string) string {
	return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %s, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: %s
`, name, ports)
}

// BenchmarkConnections measures, between two pods on different nodes,
// new TCP connections per second (connect, read the responder's banner,
// close) and UDP round trips per second on new flows (a new socket each
// time, so every round trip is judged by the rules), under each scenario.
func BenchmarkConnections(b *testing.B) {
	if m := kernelMissing(); m != "" {
		b.Skipf("SKIPPED: benchmark needs %s", m)
	}
	for _, sc := range benchScenarios() {
		b.Run(sc.name, func(b *testing.B) {
			prog := behaviour(b, sc.yaml, policy.Options{IngressNetworksAndNodes: true})
			prefix, err := newName()
			if err != nil {
				b.Fatal(err)
			}
			l, err := Up(context.Background(), prog, Options{Name: prefix})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			var elems, rules int
			for _, rs := range l.rulesets() {
				st := rs.Stats()
				elems += st.Elements
				rules += st.Rules
			}
			for _, proto := range []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP} {
				b.Run(proto.String(), func(b *testing.B) {
					benchConnections(b, l, proto)
					b.ReportMetric(float64(elems), "elements")
					b.ReportMetric(float64(rules), "rules")
				})
			}
		})
	}
}

func benchConnections(b *testing.B, l *Lab, proto policy.Protocol) {
	src := netip.MustParseAddr(clientIP4)
	dst := netip.AddrPortFrom(netip.MustParseAddr(serverIP4), 80)
	if proto == policy.ProtoUDP {
		dst = netip.AddrPortFrom(dst.Addr(), 53)
	}
	want := banner(dst.Addr(), dst.Port())
	place, _ := l.st.Topology.Locate(src)
	h, err := l.ns.Get(place.NS)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, len(want))
	b.ResetTimer()
	err = h.Do(func() error {
		for i := 0; i < b.N; i++ {
			var c net.Conn
			var err error
			if proto == policy.ProtoTCP {
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 2 * time.Second}
				c, err = d.Dial("tcp4", dst.String())
			} else {
				c, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(dst))
				if err == nil {
					_, err = c.Write([]byte("probe\n"))
				}
			}
			if err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := readFull(c, buf); err != nil {
				c.Close()
				return fmt.Errorf("connection %d: %w", i, err)
			}
			if tc, ok := c.(*net.TCPConn); ok {
				// Reset instead of TIME_WAIT, so ports do not run out.
				_ = tc.SetLinger(0)
			}
			c.Close()
		}
		return nil
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
}

func kernelMissing() string {
	if err := CheckHost(); err != nil {
		return err.Error()
	}
	return ""
}

// fiftyPods is the cluster of the lab-speed benchmark: 3 nodes, 5
// namespaces of 10 pods, every pod answering on 80/TCP, and in each
// namespace a NetworkPolicy isolating half the pods for ingress: 2,500
// flows of which 1,225 are denied (a pod always reaches itself).
func fiftyPods() string {
	var b strings.Builder
	for n := 0; n < 3; n++ {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Node\nmetadata: {name: node-%d}\nstatus: {addresses: [{type: InternalIP, address: 192.168.60.%d}]}\n---\n", n, n+1)
	}
	for ns := 0; ns < 5; ns++ {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: bench-%d}\n---\n", ns)
		fmt.Fprintf(&b, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: locked, namespace: bench-%d}
spec:
  podSelector: {matchLabels: {locked: "yes"}}
  policyTypes: [Ingress]
---
`, ns)
		for i := 0; i < 10; i++ {
			locked := map[bool]string{true: "yes", false: "no"}[i%2 == 0]
			fmt.Fprintf(&b, `apiVersion: v1
kind: Pod
metadata: {name: pod-%d, namespace: bench-%d, labels: {locked: "%s"}}
spec: {nodeName: node-%d, containers: [{name: c, ports: [{containerPort: 80}]}]}
status: {podIPs: [{ip: 10.60.%d.%d}]}
---
`, i, ns, locked, (ns*10+i)%3, ns, i+10)
		}
	}
	return strings.TrimSuffix(b.String(), "---\n")
}

// BenchmarkRun is `moat lab run` at the size users run it: 50 pods on
// one port, 2,500 flows, 1,225 denied. "records" (the default) ends a
// denied probe when the kernel reports the drop of its packet; "timeouts"
// waits out the probe timeout instead, with the same 64 probes in flight;
// "before" is the lab before drop records: timeouts, 32 in flight. All
// three in the same run. Metrics: seconds
// to build (up-s), measure (measure-s) and tear down (down-s), the flows
// and how many were denied; ns/op is the whole run.
//
//	go test -run '^$' -bench BenchmarkRun -benchtime 1x ./lab/
func BenchmarkRun(b *testing.B) {
	if m := kernelMissing(); m != "" {
		b.Skipf("SKIPPED: benchmark needs %s", m)
	}
	prog := compileBytes(b, []byte(fiftyPods()), policy.Options{})
	for _, mode := range []struct {
		name       string
		noEvidence bool
		parallel   int
	}{{"records", false, 0}, {"timeouts", true, 0}, {"before", true, 32}} {
		b.Run(mode.name, func(b *testing.B) {
			var up, measure, down time.Duration
			var flows, denied int
			for b.Loop() {
				start := time.Now()
				l, err := Up(context.Background(), prog, Options{})
				if err != nil {
					b.Fatal(err)
				}
				up += time.Since(start)
				start = time.Now()
				rep, err := l.Measure(context.Background(), ProbeOptions{noEvidence: mode.noEvidence, Parallel: mode.parallel})
				measure += time.Since(start)
				start = time.Now()
				if cerr := l.Close(); cerr != nil {
					b.Error(cerr)
				}
				down += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				flows, denied = len(rep.Flows), 0
				for _, f := range rep.Flows {
					if !f.Agree {
						b.Errorf("disagreement: %s", describe(f))
					}
					if !f.Allowed {
						denied++
					}
				}
			}
			n := float64(b.N)
			b.ReportMetric(up.Seconds()/n, "up-s")
			b.ReportMetric(measure.Seconds()/n, "measure-s")
			b.ReportMetric(down.Seconds()/n, "down-s")
			b.ReportMetric(float64(flows), "flows")
			b.ReportMetric(float64(denied), "denied")
		})
	}
}
