package flowdiff

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// dualStack is two pods and a NetworkPolicy on the first whose ingress
// peers are the given ipBlocks and a documentation range no pod is in.
func dualStack(ips [2][]string, cidrs ...string) *policy.Program {
	c := &clustergen.Cluster{}
	for _, ns := range []string{"app", "cli"} {
		c.Namespaces = append(c.Namespaces, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"kubernetes.io/metadata.name": ns}}})
	}
	for i, name := range []string{"app/db", "cli/attacker"} {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: name[:3], Name: name[4:], Labels: map[string]string{"app": name[4:]}}}
		p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{ContainerPort: 5432}}}}
		for _, ip := range ips[i] {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		p.Status.PodIP = ips[i][0]
		c.Pods = append(c.Pods, p)
	}
	var peers []networkingv1.NetworkPolicyPeer
	for _, cidr := range append(cidrs, "192.0.2.0/24") {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}})
	}
	c.NetworkPolicies = []networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "db"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: peers}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}}
	return policy.Compile(c.ToCluster(), policy.Options{})
}

// TestFamiliesComparedApart: a change that opens a flow over one family of
// a dual-stack pair is a change, whichever family the pair's first
// addresses are of (a diff that judged only the first family let an IPv6
// opening through).
func TestFamiliesComparedApart(t *testing.T) {
	dual := [2][]string{{"10.0.1.1", "fd00::1"}, {"10.0.2.1", "fd00::2"}}
	v6first := [2][]string{{"fd00::1", "10.0.1.1"}, {"fd00::2", "10.0.2.1"}}
	single := [2][]string{{"10.0.1.1"}, {"10.0.2.1"}}
	for _, tc := range []struct {
		name          string
		ips           [2][]string
		before, after []string
		want          []string // family of each change, "" single-stack
	}{
		{"IPv6 opened", dual, nil, []string{"::/0"}, []string{"IPv6"}},
		{"IPv4 opened", dual, nil, []string{"10.0.0.0/8"}, []string{"IPv4"}},
		{"IPv4 opened, IPv6 first", v6first, nil, []string{"10.0.0.0/8"}, []string{"IPv4"}},
		{"both opened", dual, nil, []string{"10.0.0.0/8", "::/0"}, []string{"IPv4", "IPv6"}},
		{"IPv6 closed", dual, []string{"::/0"}, nil, []string{"IPv6"}},
		{"single stack", single, nil, []string{"10.0.0.0/8"}, []string{""}},
		{"other family only, single stack", single, nil, []string{"::/0"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, after := dualStack(tc.ips, tc.before...), dualStack(tc.ips, tc.after...)
			for name, res := range map[string]*Result{"Compute": Compute(before, after, Options{}), "Full": Full(before, after, Options{})} {
				var got []string
				pods := &Result{}
				for _, c := range res.Changes {
					if c.From != "cli/attacker" && c.From != "app/db" {
						// The implied peer inside the CIDR the change
						// opens or closes: flows of their own.
						if c.To != "app/db" || c.Family != "" {
							t.Errorf("%s: unexpected change %+v", name, c)
						}
						continue
					}
					pods.Changes = append(pods.Changes, c)
					if c.From != "cli/attacker" || c.To != "app/db" || c.Before.Allowed == c.After.Allowed {
						t.Errorf("%s: unexpected change %+v", name, c)
					}
					got = append(got, c.Family)
				}
				if len(got) != len(tc.want) || len(got) > 0 && (got[0] != tc.want[0] || got[len(got)-1] != tc.want[len(tc.want)-1]) {
					t.Errorf("%s: changes over families %q, want %q", name, got, tc.want)
				}
				if n := pods.ChangedFlows(); n != min(len(tc.want), 1) {
					t.Errorf("%s: ChangedFlows() = %d, want %d", name, n, min(len(tc.want), 1))
				}
			}
		})
	}
}

// TestEmptyListsAreJSONArrays: no change is "changes": [], not null.
func TestEmptyListsAreJSONArrays(t *testing.T) {
	p := dualStack([2][]string{{"10.0.1.1"}, {"10.0.2.1"}})
	var b strings.Builder
	if err := WriteJSON(&b, Compute(p, p, Options{})); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"changes": []`, `"addedPods": []`, `"removedPods": []`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("JSON has no %s:\n%s", want, b.String())
		}
	}
}
