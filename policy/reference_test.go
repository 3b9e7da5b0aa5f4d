package policy_test

import (
	"net/netip"
	"testing"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// referenceAllowed is docs/semantics.md written as plainly as possible: every rule
// scanned in order through the exported Program, no index. The evaluator
// must agree with it on every flow.
func referenceAllowed(p *policy.Program, f policy.Flow) bool {
	if p.DuplicateAddr(f.Src.Addr) || p.DuplicateAddr(f.Dst.Addr) {
		return false
	}
	if f.Src.Pod >= 0 && f.Src.Pod == f.Dst.Pod {
		return true
	}
	return referenceDir(p, f.Src, f.Dst.Addr, f, policy.Egress) && referenceDir(p, f.Dst, f.Src.Addr, f, policy.Ingress)
}

func referenceDir(p *policy.Program, local policy.Endpoint, remote netip.Addr, f policy.Flow, dir policy.Direction) bool {
	if local.Pod < 0 || p.Policies[local.Pod] == nil {
		return true
	}
	if dir == policy.Ingress && !p.Options.DenyNodeLocal {
		for _, a := range p.NodeAddrs(p.Pods[local.Pod].NodeName) {
			if a == remote {
				return true
			}
		}
	}
	dp := p.Policies[local.Pod].Dir(dir)
	tier := func(rules []policy.RuleMatch) (bool, bool) {
		for _, r := range rules {
			if r.Match.Matches(remote, f.Proto, f.Port) {
				switch r.Rule.Action {
				case policy.ActionAccept:
					return true, true
				case policy.ActionDeny:
					return false, true
				}
				return false, false // Pass
			}
		}
		return false, false
	}
	if allowed, done := tier(dp.Admin); done {
		return allowed
	}
	if dp.NP != nil {
		for _, r := range dp.NP.Rules {
			if r.Match.Matches(remote, f.Proto, f.Port) {
				return true
			}
		}
		return false
	}
	if allowed, done := tier(dp.Baseline); done {
		return allowed
	}
	return true
}

// TestEvaluatorAgreesWithReference compares the indexed evaluator with the
// reference on generated clusters: pod-to-pod, pod-to-node and external
// flows, every protocol, ports on and off the policies' ports and ranges.
func TestEvaluatorAgreesWithReference(t *testing.T) {
	ports := []uint16{53, 80, 8000, 8080, 8443, 8999, 9000, 9090, 10250, 30000, 31000, 32767, 32768}
	protos := []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP, policy.ProtoSCTP, policy.ProtoICMP}
	for seed := uint64(1); seed <= 4; seed++ {
		gen := clustergen.Generate(clustergen.Config{Nodes: 6, Namespaces: 15, Pods: 240, NetworkPolicies: 40, ClusterPolicies: 16, Seed: seed})
		prog := policy.Compile(gen.ToCluster(), policy.Options{})
		var eps []policy.Endpoint
		for i := range prog.Pods {
			if len(prog.Pods[i].IPs) > 0 {
				eps = append(eps, policy.Endpoint{Pod: i, Addr: prog.Pods[i].IPs[0]})
			}
		}
		for _, a := range []string{"172.16.0.3", "192.168.7.9", "203.0.0.5", "2001:db8::1", "8.8.8.8"} {
			eps = append(eps, policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr(a)})
		}
		n := 0
		for i := 0; n < 20000; i++ {
			s, d := eps[(i*7919)%len(eps)], eps[(i*104729+13)%len(eps)]
			if s.Addr.Is4() != d.Addr.Is4() {
				continue
			}
			f := policy.Flow{Src: s, Dst: d, Proto: protos[i%len(protos)], Port: ports[(i/3)%len(ports)]}
			if f.Proto == policy.ProtoICMP {
				f.Port = 0
			}
			n++
			if got, want := prog.Allowed(f), referenceAllowed(prog, f); got != want {
				v := prog.Evaluate(f)
				t.Fatalf("seed %d: %+v: evaluator %v, reference %v\negress: %s\ningress: %s", seed, f, got, want, v.Egress.Reason, v.Ingress.Reason)
			}
			if v := prog.Evaluate(f); v.Allowed != prog.Allowed(f) {
				t.Fatalf("Evaluate and Allowed disagree on %+v", f)
			}
		}
	}
}
