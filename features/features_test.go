package features

import (
	"testing"

	"k8s.io/component-base/featuregate"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want map[featuregate.Feature]bool
	}{
		{"", map[featuregate.Feature]bool{IngressNetworksAndNodes: false, EnableClusterToMasterTraffic: false}},
		{"IngressNetworksAndNodes=true", map[featuregate.Feature]bool{IngressNetworksAndNodes: true, EnableClusterToMasterTraffic: false}},
		{"EnableClusterToMasterTraffic=true", map[featuregate.Feature]bool{IngressNetworksAndNodes: false, EnableClusterToMasterTraffic: true}},
	} {
		fg, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if tc.set != "" {
			if err := fg.Set(tc.set); err != nil {
				t.Fatalf("Set(%q): %v", tc.set, err)
			}
		}
		for name, want := range tc.want {
			if got := fg.Enabled(name); got != want {
				t.Errorf("after %q: %s = %v, want %v", tc.set, name, got, want)
			}
		}
	}
	fg, _ := New()
	if err := fg.Set("NoSuchGate=true"); err == nil {
		t.Error("an unknown gate was accepted")
	}
}

// moat and moat-agent list the same gates on --feature-gates: the policy
// compiler's, not the registry's AllAlpha and AllBeta, the logging gates
// or the tunnel's, which the agent's gate also holds.
func TestPolicyGates(t *testing.T) {
	agent, err := New()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewCLI()
	if err != nil {
		t.Fatal(err)
	}
	want := "IngressNetworksAndNodes=true|false (ALPHA - default=false)"
	for name, fg := range map[string]featuregate.MutableFeatureGate{"New": agent, "NewCLI": cli} {
		if got := PolicyGates(fg); len(got) != 1 || got[0] != want {
			t.Errorf("PolicyGates(%s()) = %q, want [%q]", name, got, want)
		}
	}
}
