package decode

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/policy"
)

// Issue 9.7: every field the CRD requires, when missing, is a validation
// error at its path. One object per schema location, holding the path to
// it and nothing at it.
func TestEveryRequiredFieldIsEnforced(t *testing.T) {
	table, _ := requiredFromCRD(t)
	if len(table) < 10 {
		t.Fatalf("only %d locations with required fields: the CRD walk is broken", len(table))
	}
	for loc, names := range table {
		t.Run("at "+loc, func(t *testing.T) {
			obj := map[string]any{"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": map[string]any{"name": "c"}}
			concrete := ""
			if loc != "" {
				var cur any = obj
				for _, seg := range strings.Split(loc, ".") {
					name, isList := strings.CutSuffix(seg, "[]")
					m := cur.(map[string]any)
					next := map[string]any{}
					if isList {
						m[name] = []any{next}
					} else {
						m[name] = next
					}
					cur = next
					concrete += "." + name
					if isList {
						concrete += "[0]"
					}
				}
				concrete = strings.TrimPrefix(concrete, ".")
			} else {
				names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == "metadata" }) // see TestMissingMetadata
			}
			js, _ := json.Marshal(obj)
			var res Result
			if err := res.DecodeJSON("t", bytes.NewReader(js)); err != nil {
				t.Fatal(err)
			}
			if len(res.Cluster.ClusterNetworkPolicies) != 1 {
				t.Fatalf("not loaded: %v", res.Diagnostics)
			}
			cnp := res.Cluster.ClusterNetworkPolicies[0]
			var got []string
			for _, e := range cnp.Invalid {
				if e.Type == "FieldValueRequired" {
					got = append(got, e.Field)
				}
			}
			for _, n := range names {
				want := n
				if concrete != "" {
					want = concrete + "." + n
				}
				if !slices.Contains(got, want) {
					t.Errorf("missing %s not reported; required errors: %v", want, got)
				}
			}
			prog := policy.Compile(&res.Cluster, policy.Options{IngressNetworksAndNodes: true})
			if prog.Status[0].Accepted {
				t.Errorf("accepted with required fields missing: %+v", prog.Status[0])
			}
		})
	}
}

// A policy without metadata has no name: it cannot be loaded.
func TestMissingMetadata(t *testing.T) {
	var res Result
	if err := res.DecodeJSON("t", strings.NewReader(`{"apiVersion":"policy.networking.k8s.io/v1alpha2","kind":"ClusterNetworkPolicy","spec":{}}`)); err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) != 1 || !strings.Contains(res.Diagnostics[0].String(), "metadata.name: Required value") {
		t.Errorf("dropped %v, diagnostics %v", res.Dropped, res.Diagnostics)
	}
}

const requiredInventory = `
{"apiVersion":"v1","kind":"List","items":[
 {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a","labels":{"env":"prod"}}},
 {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"b","labels":{"env":"dev"}}},
 {"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","namespace":"a","labels":{"app":"x"}},"spec":{"nodeName":"n"},"status":{"podIP":"10.0.0.1"}},
 {"apiVersion":"v1","kind":"Pod","metadata":{"name":"y","namespace":"b","labels":{"app":"y"}},"spec":{"nodeName":"n"},"status":{"podIP":"10.0.0.2"}}
]}`

// Missing required fields fail closed in the compiled program: what the
// policy would have allowed is not, and what it denies stays denied (a
// missing priority never becomes priority 0 Accept).
func TestMissingRequiredFailsClosed(t *testing.T) {
	// baseline denies all ingress to prod (a/x): only an Admin Accept lets
	// b/y in.
	const baseline = `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-deny}
spec: {tier: Baseline, priority: 1, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Deny, from: [{namespaces: {}}]}]}`
	for _, tc := range []struct {
		name, spec string
		// y->x: is b/y allowed to reach a/x on TCP 80 with the field
		// present (complete) and missing (the spec as given)?
		complete  string
		yx, xy    bool // expected with the field missing
		completed [2]bool
	}{
		{
			name:     "priority",
			spec:     `{tier: Admin, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
		{
			name:     "tier",
			spec:     `{priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
		{
			// The subject could be any pod: the Deny applies to all.
			name:     "subject.pods.podSelector",
			spec:     `{tier: Admin, priority: 5, subject: {pods: {namespaceSelector: {matchLabels: {env: dev}}}}, egress: [{action: Deny, to: [{namespaces: {}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {pods: {namespaceSelector: {matchLabels: {env: dev}}, podSelector: {}}}, egress: [{action: Deny, to: [{namespaces: {}}]}]}`,
			yx:       false, xy: false, completed: [2]bool{false, true},
		},
		{
			name:     "ingress action",
			spec:     `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{from: [{namespaces: {}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
		{
			name:     "ingress from",
			spec:     `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
		{
			name:     "peer pods.podSelector",
			spec:     `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{pods: {namespaceSelector: {}}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{pods: {namespaceSelector: {}, podSelector: {}}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
		{
			name:     "range start",
			spec:     `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {end: 90}}}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchLabels: {env: prod}}}, ingress: [{action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 70, end: 90}}}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
		{
			name:     "matchExpressions operator",
			spec:     `{tier: Admin, priority: 5, subject: {namespaces: {matchExpressions: [{key: env, values: [prod]}]}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			complete: `{tier: Admin, priority: 5, subject: {namespaces: {matchExpressions: [{key: env, operator: In, values: [prod]}]}}, ingress: [{action: Accept, from: [{namespaces: {}}]}]}`,
			yx:       false, xy: true, completed: [2]bool{true, true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, spec := range []string{tc.complete, tc.spec} {
				doc := "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: under-test}\nspec: " + spec
				prog := compileDocs(t, requiredInventory, baseline, doc)
				yx, xy := allowed(t, prog, "b/y", "a/x"), allowed(t, prog, "a/x", "b/y")
				want := tc.completed
				if i == 1 {
					want = [2]bool{tc.yx, tc.xy}
				}
				if [2]bool{yx, xy} != want {
					t.Errorf("%s: y->x %v, x->y %v; want %v\n%v", []string{"complete", "missing"}[i], yx, xy, want, prog.Diagnostics)
				}
				st := prog.Status[len(prog.Status)-1]
				if st.Policy.Name != "under-test" || st.Accepted != (i == 0) {
					t.Errorf("%s: status %+v", []string{"complete", "missing"}[i], st)
				}
			}
		})
	}
}

// compileDocs decodes JSON and YAML documents as the file loader would.
func compileDocs(t *testing.T, docs ...string) *policy.Program {
	t.Helper()
	var res Result
	for i, d := range docs {
		js, err := yaml.YAMLToJSONStrict([]byte(d))
		if err != nil {
			t.Fatal(err)
		}
		if err := res.DecodeJSONBytes("doc"+string(rune('0'+i)), js); err != nil {
			t.Fatal(err)
		}
	}
	if len(res.Dropped) > 0 {
		t.Fatalf("dropped: %v", res.Diagnostics)
	}
	return policy.Compile(&res.Cluster, policy.Options{})
}

func allowed(t *testing.T, p *policy.Program, from, to string) bool {
	t.Helper()
	src, err := p.ParseEndpoint(from)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := p.ParseEndpoint(to)
	if err != nil {
		t.Fatal(err)
	}
	src.Addr, dst.Addr = p.Pods[src.Pod].IPs[0], p.Pods[dst.Pod].IPs[0]
	return p.Allowed(policy.Flow{Src: src, Dst: dst, Proto: policy.ProtoTCP, Port: 80})
}
