package agent

import (
	"net/netip"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/policy"
)

func unstructuredFrom(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatalf("test YAML: %v", err)
	}
	return u
}

const cnpHead = `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: p, uid: u1, generation: 3, resourceVersion: "7"}
`

func TestDecodeCNP(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		spec                 string
		gate                 bool
		unknown, bad, gated  []string // bad: parts decoding could not read
		ingressRules, egress int
		wantAccepted         bool
		wantReason           string
		check                func(t *testing.T, d *decodedCNP)
	}{{
		name:         "valid",
		spec:         `spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}`,
		ingressRules: 1, wantAccepted: true,
	}, {
		name:         "unknown peer field",
		spec:         `spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{serviceAccounts: {name: x}}]}]}`,
		unknown:      []string{"spec.ingress[0].from[0].serviceAccounts"},
		ingressRules: 1, wantReason: ReasonUnknownField,
	}, {
		name: "priority of the wrong type",
		spec: `spec: {tier: Admin, priority: "high", subject: {namespaces: {}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}`,
		bad:  []string{"spec.priority"}, ingressRules: 1, wantReason: ReasonInvalidSpec,
		check: func(t *testing.T, d *decodedCNP) {
			if d.Spec.Ingress[0].Action != "Deny" || d.Spec.Subject.Namespaces == nil {
				t.Errorf("the parts that decode were lost: %+v", d.Spec)
			}
		},
	}, {
		name: "one rule of the wrong type keeps its index",
		spec: `spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: Accept, from: [{namespaces: {}}]}, {action: 7}]}`,
		bad:  []string{"spec.ingress[1].action"}, ingressRules: 2, wantReason: ReasonInvalidSpec,
		check: func(t *testing.T, d *decodedCNP) {
			if d.Spec.Ingress[0].Action != "Accept" || d.Spec.Ingress[1].Action != "" {
				t.Errorf("rules = %+v", d.Spec.Ingress)
			}
		},
	}, {
		name: "rule list that is not a list",
		spec: `spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, egress: "all"}`,
		bad:  []string{"spec.egress"}, egress: 1, wantReason: ReasonInvalidSpec,
	}, {
		name: "spec that is not an object",
		spec: `spec: 42`,
		bad:  []string{"spec", "spec.egress[0]", "spec.ingress[0]", "spec.subject"}, ingressRules: 1, egress: 1, wantReason: ReasonInvalidSpec,
	}, {
		name:  "NPEP-127 ingress peers with the gate off",
		spec:  `spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{networks: [10.0.0.0/8]}, {nodes: {}}, {namespaces: {}}]}]}`,
		gated: []string{"spec.ingress[0].from[0].networks", "spec.ingress[0].from[1].nodes"}, ingressRules: 1, wantReason: ReasonUnknownField,
		check: func(t *testing.T, d *decodedCNP) {
			// Decoding keeps them; the compiler gates them.
			p := d.Spec.Ingress[0].From
			if p[0].Networks == nil || p[1].Nodes == nil || p[2].Namespaces == nil {
				t.Errorf("peers = %+v", p)
			}
		},
	}, {
		name: "NPEP-127 ingress peers with the gate on",
		spec: `spec: {tier: Admin, priority: 5, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{networks: [10.0.0.0/8]}, {nodes: {}}]}]}`,
		gate: true, ingressRules: 1, wantAccepted: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d := decodeCNP(unstructuredFrom(t, cnpHead+tc.spec))
			if d.Name != "p" || d.UID != "u1" || d.Generation != 3 || d.ResourceVersion != "7" {
				t.Errorf("identity lost: %+v", d.GetObjectMeta())
			}
			bad := undecodable(d.Invalid)
			slices.Sort(bad)
			if !slices.Equal(bad, tc.bad) {
				t.Errorf("undecodable = %v, want %v", bad, tc.bad)
			}
			opts := policy.Options{IngressNetworksAndNodes: tc.gate}
			if gated := policy.GatedFields(&d.ClusterNetworkPolicy, opts); !slices.Equal(gated, tc.gated) {
				t.Errorf("gated = %v, want %v", gated, tc.gated)
			}
			if !slices.Equal(d.UnknownFields, tc.unknown) {
				t.Errorf("UnknownFields = %v, want %v", d.UnknownFields, tc.unknown)
			}
			if len(d.Spec.Ingress) != tc.ingressRules || len(d.Spec.Egress) != tc.egress {
				t.Errorf("rules: %d ingress, %d egress; want %d, %d", len(d.Spec.Ingress), len(d.Spec.Egress), tc.ingressRules, tc.egress)
			}
			prog := policy.Compile(&policy.Cluster{ClusterNetworkPolicies: []policy.ClusterNetworkPolicy{d.ClusterNetworkPolicy}}, opts)
			if len(prog.Status) != 1 {
				t.Fatalf("status = %+v", prog.Status)
			}
			st := prog.Status[0]
			if st.Accepted != tc.wantAccepted || (!tc.wantAccepted && st.Reason != tc.wantReason) {
				t.Errorf("status = %+v, want accepted=%v reason %q", st, tc.wantAccepted, tc.wantReason)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
			cp := d.DeepCopyObject().(*decodedCNP)
			if !slices.Equal(cp.UnknownFields, d.UnknownFields) || len(cp.Invalid) != len(d.Invalid) || cp.ClusterNetworkPolicy.ClusterNetworkPolicy == d.ClusterNetworkPolicy.ClusterNetworkPolicy {
				t.Errorf("DeepCopyObject lost decoding results or shares the object")
			}
		})
	}
}

func TestDecodeNP(t *testing.T) {
	head := `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: a, generation: 2}
`
	for _, tc := range []struct {
		name         string
		spec         string
		unknown, bad []string
		ingressRules int
		// allowed: whether pod a/y may reach a/x on TCP 80.
		allowed bool
	}{
		{"valid", `spec: {podSelector: {}, ingress: [{ports: [{port: 80, endPort: 90}]}]}`, nil, nil, 1, true},
		{"unknown field", `spec: {podSelector: {}, ingress: [{from: [{serviceAccount: x}]}]}`, []string{"spec.ingress[0].from[0].serviceAccount"}, nil, 1, false},
		{"rule of the wrong type", `spec: {podSelector: {}, ingress: [{ports: "80"}]}`, nil, []string{"spec.ingress[0].ports"}, 1, false},
		{"rule of the wrong type beside a good one", `spec: {podSelector: {}, ingress: [{ports: "80"}, {ports: [{port: 80}]}]}`, nil, []string{"spec.ingress[0].ports"}, 2, true},
		{"port of the wrong type beside a good one", `spec: {podSelector: {}, ingress: [{ports: [{port: true}, {port: 80}]}]}`, nil, []string{"spec.ingress[0].ports[0].port"}, 1, true},
		{"port of the wrong type alone", `spec: {podSelector: {}, ingress: [{ports: [{port: true}]}]}`, nil, []string{"spec.ingress[0].ports[0].port"}, 1, false},
		{"rule list that is not a list", `spec: {podSelector: {}, ingress: {ports: [{port: 80}]}}`, nil, []string{"spec.ingress"}, 1, false},
		{"selector of the wrong type", `spec: {podSelector: "app=x", ingress: [{from: [{podSelector: {matchLabels: {app: z}}}]}]}`, nil, []string{"spec.podSelector"}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := decodeNP(unstructuredFrom(t, head+tc.spec))
			if d.Name != "np" || d.Namespace != "a" || d.Generation != 2 {
				t.Errorf("identity lost: %+v", d.GetObjectMeta())
			}
			if bad := undecodable(d.Invalid()); !slices.Equal(bad, tc.bad) {
				t.Errorf("undecodable = %v, want %v", bad, tc.bad)
			}
			if !slices.Equal(d.UnknownFields(), tc.unknown) {
				t.Errorf("UnknownFields = %v, want %v", d.UnknownFields(), tc.unknown)
			}
			if len(d.Spec.Ingress) != tc.ingressRules {
				t.Errorf("%d ingress rules, want %d", len(d.Spec.Ingress), tc.ingressRules)
			}
			x := policy.Pod{Namespace: "a", Name: "x", Labels: map[string]string{"app": "x"}, NodeName: "n", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
			y := policy.Pod{Namespace: "a", Name: "y", Labels: map[string]string{"app": "y"}, NodeName: "n", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}}
			prog := policy.Compile(&policy.Cluster{Pods: []*policy.Pod{&x, &y}, NetworkPolicies: []*policy.NetworkPolicy{&d.NetworkPolicy}}, policy.Options{})
			ix, _ := prog.PodByKey("a/x")
			iy, _ := prog.PodByKey("a/y")
			flow := policy.Flow{Src: policy.Endpoint{Pod: iy, Addr: y.IPs[0]}, Dst: policy.Endpoint{Pod: ix, Addr: x.IPs[0]}, Proto: policy.ProtoTCP, Port: 80}
			if got := prog.Allowed(flow); got != tc.allowed {
				t.Errorf("a/y -> a/x:80 allowed = %v, want %v (%+v)", got, tc.allowed, prog.Evaluate(flow))
			}
		})
	}
}
