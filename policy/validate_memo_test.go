package policy_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/policy"
)

// A validator that remembers valid selectors reports exactly what the
// plain validation does, for every policy, however often a selector
// (valid or not) repeats and in whichever field: an error it hid would
// let a policy whose selector is invalid compile as if it were valid.
func TestValidatorMemoReportsWhatValidationDoes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	sels := []*metav1.LabelSelector{
		{},
		{MatchLabels: map[string]string{"app": "web"}},
		{MatchLabels: map[string]string{"app": "web", "tier": "front"}},
		{MatchLabels: map[string]string{"app": "-bad-"}},                 // invalid value
		{MatchLabels: map[string]string{"bad key!": "web"}},              // invalid key
		{MatchLabels: map[string]string{"app": "web", "x/y/z": "front"}}, // invalid key among valid
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web"}}}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}},                              // In without values
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists, Values: []string{"web"}}}}, // Exists with values
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Like", Values: []string{"web"}}}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}},
		// The same strings split differently between key and value.
		{MatchLabels: map[string]string{"ab": "c"}},
		{MatchLabels: map[string]string{"a": "bc"}},
		// A count and the length after it split differently: eleven
		// valid values, and one invalid value spelling the other ten's
		// length prefixes ("1"+"140:" against "11"+"40:").
		collidingCount(false),
		collidingCount(true),
	}
	pick := func() *metav1.LabelSelector { return sels[r.IntN(len(sels))] }
	var nps []*policy.NetworkPolicy
	for i := range 400 {
		np := &policy.NetworkPolicy{Namespace: "ns", Name: fmt.Sprintf("p%d", i)}
		np.Spec.PodSelector = *pick()
		for range r.IntN(3) {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: pick(), NamespaceSelector: pick()}, {PodSelector: pick()}}})
		}
		for range r.IntN(2) {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: pick()}}})
		}
		nps = append(nps, np)
	}
	c := clustergen.Generate(clustergen.Config{Nodes: 3, Namespaces: 20, Pods: 200, NetworkPolicies: 140, ClusterPolicies: 30, Seed: 9, Workloads: true}).ToCluster()
	for i := range c.ClusterNetworkPolicies {
		if i%3 == 0 { // an invalid selector in the subject of some
			cnp := c.ClusterNetworkPolicies[i].ClusterNetworkPolicy.DeepCopy()
			if cnp.Spec.Subject.Namespaces != nil {
				cnp.Spec.Subject.Namespaces = sels[3+i%3]
			}
			c.ClusterNetworkPolicies[i].ClusterNetworkPolicy = cnp
		}
	}
	v := policy.NewMemoValidator()
	invalid := 0
	for round := range 2 { // the second round with every valid selector remembered
		for _, np := range append(nps, c.NetworkPolicies...) {
			want, got := fmt.Sprint(policy.ValidateNetworkPolicy(np)), v.NetworkPolicy(np)
			if got != want {
				t.Fatalf("round %d, %s: %s, want %s", round, np.Name, got, want)
			}
			if want != "[]" {
				invalid++
			}
		}
		for i := range c.ClusterNetworkPolicies {
			cnp := &c.ClusterNetworkPolicies[i]
			want, got := fmt.Sprint(policy.ValidateClusterNetworkPolicy(cnp.ClusterNetworkPolicy)), v.ClusterNetworkPolicy(cnp)
			if got != want {
				t.Fatalf("round %d, %s: %s, want %s", round, cnp.Name, got, want)
			}
			if want != "[]" {
				invalid++
			}
		}
	}
	if invalid == 0 || v.Remembered() == 0 {
		t.Fatalf("the test validated no invalid policy (%d) or remembered no selector (%d)", invalid, v.Remembered())
	}
}

// collidingCount is a selector k In [a*40, ten 8-byte values] (valid), or
// (invalid) k In [one value holding all of them with their length
// prefixes, ':' included]: their keys would be equal if a count ran into
// the length after it.
func collidingCount(invalid bool) *metav1.LabelSelector {
	first := strings.Repeat("a", 40)
	values, joined := []string{first}, first
	for i := range 10 {
		v := "b" + strings.Repeat(string(rune('a'+i)), 7)
		values = append(values, v)
		joined += "8:" + v
	}
	if invalid {
		values = []string{joined}
	}
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: metav1.LabelSelectorOpIn, Values: values}}}
}
