package nft

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// unionYAML is node-1 with two local pods that n NetworkPolicies select
// (ingress only), each with the peer and ports policy(i) gives: more
// than maxLookups policies make a union run.
func unionYAML(n int, policy func(i int) (from, ports string)) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nstatus: {addresses: [{type: InternalIP, address: 192.168.0.1}]}\n---\n")
	b.WriteString("apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n")
	for i := range 2 {
		fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata: {name: l%d, namespace: shop, labels: {app: x}}\nspec: {nodeName: node-1, containers: [{name: c}]}\nstatus: {podIPs: [{ip: 172.16.1.%d}, {ip: 'fd00::%d'}]}\n---\n", i, 10+i, 10+i)
	}
	for i := range n {
		from, ports := policy(i)
		fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np%d, namespace: shop}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n  ingress: [{from: [%s], ports: [%s]}]\n---\n", i, from, ports)
	}
	return b.String()
}

// allButOwn24 (the probe's shape 2q): policy i allows 0.0.0.0/0 except
// 11.(i/256).(i%256).0/24 on TCP port 1000+2i. Cut along addresses, each of the 2n
// address pieces is under n-1 ports (n^2 boxes); cut along ports, each
// port is over two address ranges (2n boxes).
func allButOwn24(i int) (string, string) {
	return fmt.Sprintf("{ipBlock: {cidr: 0.0.0.0/0, except: [11.%d.%d.0/24]}}", i>>8, i&255), fmt.Sprintf("{port: %d}", 1000+2*i)
}

// own24AllButOwnPort: policy i < 128 allows 11.0.2i.0/24 on every TCP port but
// 1000+i. Cut along ports, each of the ~2n port pieces is over n-1
// address ranges (n^2 boxes); cut along addresses, each /24 is under two
// port ranges (2n boxes).
func own24AllButOwnPort(i int) (string, string) {
	return fmt.Sprintf("{ipBlock: {cidr: 11.0.%d.0/24}}", 2*i), fmt.Sprintf("{port: 1, endPort: %d}, {port: %d, endPort: 65535}", 999+i, 1001+i)
}

// exceptsTimesPorts (the probe's shape 2): policy i allows 10.i.0.0/16
// less 40 /31s (41 ranges) on 20 port ranges: its own term is 820 boxes
// however cut, from 61 ranges.
func exceptsTimesPorts(i int) (string, string) {
	var except, ports []string
	for j := range 40 {
		except = append(except, fmt.Sprintf("10.%d.%d.%d/31", i, j/64, (j%64)*4))
	}
	for k := range 20 {
		ports = append(ports, fmt.Sprintf("{port: %d, endPort: %d}", 1000+10*k, 1003+10*k))
	}
	return fmt.Sprintf("{ipBlock: {cidr: 10.%d.0.0/16, except: [%s]}}", i, strings.Join(except, ", ")), strings.Join(ports, ", ")
}

// BenchmarkUnionCut builds node-1 of unionYAML for shapes whose unions
// blew up when cut along addresses only, reporting the node's rules and
// set elements and the CPU time of a build (all threads: the machine is
// shared, wall times swing with its load): shape 2q (allButOwn24, a port
// cut makes it linear), excepts times ports (over budget: shared
// lookups), 20 of those among 380 policies of one /24 and port each (the
// 20 take shared lookups, the rest a union), hundreds of /24s on one or
// three lists of 20 port ranges (over budget: a lookup per list) and
// shape 1 (each policy its
// own /24 less 8 /28s, its own ports: the cut's time must stay
// near-linear).
func BenchmarkUnionCut(b *testing.B) {
	for _, bc := range []struct {
		name   string
		n      int
		policy func(int) (string, string)
	}{
		{"allButOwn24/160", 160, allButOwn24},
		{"allButOwn24/640", 640, allButOwn24},
		{"exceptsTimesPorts/100", 100, exceptsTimesPorts},
		{"fatAmongLean/400", 400, fatAmongLean(20)},
		{"ownOnList/250", 250, ownOnList(1)},
		{"ownOnList3/1000", 1000, ownOnList(3)},
		{"ownPorts/2000", 2000, ownPorts},
		{"ownPorts/8000", 8000, ownPorts},
	} {
		b.Run(bc.name, func(b *testing.B) {
			prog := compileYAML(b, unionYAML(bc.n, bc.policy))
			var rs *Ruleset
			runtime.GC()
			cpu := cpuTime(b)
			for b.Loop() {
				rs = Build(prog, "node-1")
			}
			b.ReportMetric((cpuTime(b)-cpu).Seconds()/float64(b.N), "cpu-s/op")
			st := rs.Stats()
			b.ReportMetric(float64(st.Rules), "rules")
			b.ReportMetric(float64(st.Elements), "elements")
		})
	}
}

// fatAmongLean: policies i < fat are exceptsTimesPorts, the others
// allow 11.(i/256).(i%256).0/24 on TCP port 2000+i.
func fatAmongLean(fat int) func(int) (string, string) {
	return func(i int) (string, string) {
		if i < fat {
			return exceptsTimesPorts(i)
		}
		return fmt.Sprintf("{ipBlock: {cidr: 11.%d.%d.0/24}}", i>>8, i&255), fmt.Sprintf("{port: %d}", 2000+i)
	}
}

// ownPorts (the probe's shape 1, ingress): policy i allows its own /24
// less 8 /28s on TCP 1000+i to 1000+i+i%50 and UDP 20000+i.
func ownPorts(i int) (string, string) {
	var except []string
	for j := range 8 {
		except = append(except, fmt.Sprintf("20.%d.%d.%d/28", i>>8, i&255, 32*j))
	}
	return fmt.Sprintf("{ipBlock: {cidr: 20.%d.%d.0/24, except: [%s]}}", i>>8, i&255, strings.Join(except, ", ")),
		fmt.Sprintf("{port: %d, endPort: %d}, {port: %d, protocol: UDP}", 1000+i, 1000+i+i%50, 20000+i)
}

// ownOnList: policy i allows its own /24 (apart from the others', so
// that they do not merge into one range) on port list i % lists, 20 TCP
// ranges of 2 ports, lists 100 ports apart. One such peer is 20 boxes
// from 21 ranges (not fat); hundreds on one list are.
func ownOnList(lists int) func(int) (string, string) {
	return func(i int) (string, string) {
		return fmt.Sprintf("{ipBlock: {cidr: %s}}", apartCIDR(i)), listPorts(i % lists)
	}
}

// apartCIDR is the /24 of policy i, one /24 apart from its neighbours'.
func apartCIDR(i int) string {
	return fmt.Sprintf("10.%d.%d.0/24", i>>7, 2*(i&127))
}

// listPorts is port list l in NetworkPolicy syntax.
func listPorts(l int) string {
	var ports []string
	for k := range 20 {
		ports = append(ports, fmt.Sprintf("{port: %d, endPort: %d}", 1000+100*l+4*k, 1001+100*l+4*k))
	}
	return strings.Join(ports, ", ")
}
