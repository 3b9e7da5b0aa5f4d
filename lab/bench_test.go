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
			prefix, err := NewPrefix()
			if err != nil {
				b.Fatal(err)
			}
			l, err := Up(context.Background(), prog, Options{Name: prefix})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			var elems, rules int
			for _, rs := range l.Rulesets() {
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
	place, _ := l.Topology().Locate(src)
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
