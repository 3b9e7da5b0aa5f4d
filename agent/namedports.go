package agent

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/moat-net/moat/policy"
)

// namedPortProblems finds NetworkPolicy ports that name a container port
// no relevant pod declares, so the rule allows nothing on them: for
// ingress the pods the policy selects (the destinations), for egress any
// pod of the cluster (pods are the compiled program's, with current
// labels). It returns messages by "namespace/name". Policies
// that select no pod are left alone: they have nothing to resolve on yet.
func namedPortProblems(nps map[string]*decodedNP, pods []policy.Pod) map[string][]string {
	type portKey struct {
		name  string
		proto policy.Protocol
	}
	anywhere := map[portKey]bool{}
	byNS := map[string][]*policy.Pod{}
	for i := range pods {
		p := &pods[i]
		if p.HostNetwork || len(p.IPs) == 0 {
			continue
		}
		byNS[p.Namespace] = append(byNS[p.Namespace], p)
		for _, cp := range p.Ports {
			if cp.Name != "" {
				anywhere[portKey{cp.Name, cp.Protocol}] = true
			}
		}
	}
	declares := func(p *policy.Pod, k portKey) bool {
		for _, cp := range p.Ports {
			if cp.Name == k.name && cp.Protocol == k.proto {
				return true
			}
		}
		return false
	}
	type namedPort struct {
		index int
		portKey
	}
	named := func(ports []networkingv1.NetworkPolicyPort) []namedPort {
		var out []namedPort
		for i, p := range ports {
			if p.Port == nil || p.Port.Type != intstr.String {
				continue
			}
			proto := policy.ProtoTCP
			if p.Protocol != nil {
				pr, err := policy.ParseProtocol(string(*p.Protocol))
				if err != nil {
					continue // invalid: the compiler reports it
				}
				proto = pr
			}
			out = append(out, namedPort{i, portKey{p.Port.StrVal, proto}})
		}
		return out
	}
	out := map[string][]string{}
	for key, np := range nps {
		var selected []*policy.Pod
		resolved := false
		selectedPods := func() []*policy.Pod {
			if resolved {
				return selected
			}
			resolved = true
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				return nil
			}
			for _, p := range byNS[np.Namespace] {
				if sel.Matches(labels.Set(p.Labels)) {
					selected = append(selected, p)
				}
			}
			return selected
		}
		for i, r := range np.Spec.Ingress {
			for _, k := range named(r.Ports) {
				pods := selectedPods()
				if len(pods) == 0 {
					continue
				}
				found := false
				for _, p := range pods {
					if declares(p, k.portKey) {
						found = true
						break
					}
				}
				if !found {
					out[key] = append(out[key], fmt.Sprintf("spec.ingress[%d].ports[%d].port: named port %q (%s) is declared by none of the %d pods the policy selects: the rule allows no traffic on it", i, k.index, k.name, protoName(k.proto), len(pods)))
				}
			}
		}
		for i, r := range np.Spec.Egress {
			for _, k := range named(r.Ports) {
				if !anywhere[k.portKey] {
					out[key] = append(out[key], fmt.Sprintf("spec.egress[%d].ports[%d].port: named port %q (%s) is declared by no pod in the cluster: the rule allows no traffic on it", i, k.index, k.name, protoName(k.proto)))
				}
			}
		}
	}
	return out
}

func protoName(p policy.Protocol) string {
	switch p {
	case policy.ProtoUDP:
		return string(corev1.ProtocolUDP)
	case policy.ProtoSCTP:
		return string(corev1.ProtocolSCTP)
	}
	return string(corev1.ProtocolTCP)
}
