package v1alpha2_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	upstream "sigs.k8s.io/network-policy-api/apis/v1alpha2"
	"sigs.k8s.io/yaml"

	moat "github.com/moat-net/moat/api/v1alpha2"
)

// compatCases are manifests that together use every field of the API, both
// tiers, every peer kind and every protocol form. moatOnly marks manifests
// that use the NPEP-127 ingress peers, which upstream v0.2.0 lacks.
var compatCases = []struct {
	name     string
	moatOnly bool
	manifest string
}{
	{
		name: "admin, namespaces subject, every ingress and egress peer, every protocol form",
		manifest: `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata:
  name: everything
  labels: {team: net}
  annotations: {note: "all fields"}
spec:
  tier: Admin
  priority: 0
  subject:
    namespaces:
      matchLabels: {env: prod}
      matchExpressions:
      - {key: tier, operator: In, values: [web, api]}
      - {key: legacy, operator: DoesNotExist}
  ingress:
  - name: allow-monitoring
    action: Accept
    from:
    - namespaces:
        matchLabels: {kubernetes.io/metadata.name: monitoring}
    - pods:
        namespaceSelector:
          matchExpressions:
          - {key: env, operator: NotIn, values: [dev]}
        podSelector:
          matchLabels: {app: prometheus}
    protocols:
    - tcp: {destinationPort: {number: 9090}}
    - udp: {destinationPort: {range: {start: 30000, end: 32767}}}
    - sctp: {destinationPort: {number: 65535}}
    - destinationNamedPort: metrics
  - name: deny-rest
    action: Deny
    from:
    - namespaces: {}
  - action: Pass
    from:
    - pods:
        namespaceSelector: {}
        podSelector: {}
    protocols:
    - tcp: {destinationPort: {range: {start: 1, end: 65535}}}
  egress:
  - name: dns
    action: Accept
    to:
    - pods:
        namespaceSelector:
          matchLabels: {kubernetes.io/metadata.name: kube-system}
        podSelector:
          matchLabels: {k8s-app: kube-dns}
    protocols:
    - udp: {destinationPort: {number: 53}}
    - tcp: {destinationPort: {number: 53}}
  - name: nodes
    action: Deny
    to:
    - nodes:
        matchExpressions:
        - {key: node-role.kubernetes.io/control-plane, operator: Exists}
  - name: external
    action: Accept
    to:
    - networks: ["10.0.0.0/8", "192.168.1.1/32", "fd00::/8", "2001:db8::/32"]
    protocols:
    - tcp: {destinationPort: {number: 5432}}
  - name: domains
    action: Accept
    to:
    - domainNames: ["kubernetes.io", "*.example.com", "api.github.com."]
  - name: pass-namespaces
    action: Pass
    to:
    - namespaces:
        matchLabels: {trusted: "true"}
status:
  conditions:
  - type: Ready
    status: "True"
    reason: Programmed
    message: policy is enforced on all nodes
    observedGeneration: 3
    lastTransitionTime: "2025-06-01T12:00:00Z"
`,
	},
	{
		name: "baseline, pods subject, egress only",
		manifest: `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: baseline-egress}
spec:
  tier: Baseline
  priority: 1000
  subject:
    pods:
      namespaceSelector:
        matchLabels: {env: dev}
      podSelector:
        matchExpressions:
        - {key: app, operator: Exists}
  egress:
  - action: Deny
    to:
    - networks: ["0.0.0.0/0", "::/0"]
    protocols:
    - tcp: {destinationPort: {range: {start: 1, end: 110}}}
    - tcp: {destinationPort: {range: {start: 112, end: 444}}}
    - sctp: {destinationPort: {number: 9899}}
`,
	},
	{
		name: "minimal: empty namespaces subject, no rules",
		manifest: `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: minimal}
spec:
  tier: Admin
  priority: 500
  subject:
    namespaces: {}
`,
	},
	{
		name: "list of policies as kubectl get -o yaml prints it",
		manifest: `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicyList
metadata: {resourceVersion: "42"}
items:
- apiVersion: policy.networking.k8s.io/v1alpha2
  kind: ClusterNetworkPolicy
  metadata: {name: a, uid: 0f1e2d3c-0000-4000-8000-000000000001, resourceVersion: "7", generation: 2}
  spec:
    tier: Baseline
    priority: 10
    subject: {namespaces: {}}
    ingress:
    - action: Accept
      from: [{namespaces: {}}]
      protocols: [{destinationNamedPort: http}]
- apiVersion: policy.networking.k8s.io/v1alpha2
  kind: ClusterNetworkPolicy
  metadata: {name: b}
  spec:
    tier: Admin
    priority: 11
    subject: {namespaces: {matchLabels: {a: b}}}
    egress:
    - action: Pass
      to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}}]
`,
	},
	{
		name:     "NPEP-127 ingress networks and nodes (Moat only)",
		moatOnly: true,
		manifest: `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: npep-127}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  ingress:
  - name: db-from-office
    action: Accept
    from:
    - networks: ["203.0.113.0/24", "2001:db8:1::/48"]
    protocols:
    - tcp: {destinationPort: {number: 5432}}
  - name: compromised-node
    action: Deny
    from:
    - nodes:
        matchLabels: {kubernetes.io/hostname: worker-3}
  - name: pass-cluster
    action: Pass
    from:
    - namespaces: {}
  - name: deny-outside
    action: Deny
    from:
    - networks: ["0.0.0.0/0", "::/0"]
`,
	},
}

// TestWireCompatibility decodes every manifest into Moat's and upstream's
// types and requires the re-encoded JSON to be identical (for the fields
// upstream has), Moat's encoding to keep every input field, and each side's
// output to decode strictly into the other side's types.
func TestWireCompatibility(t *testing.T) {
	for _, tc := range compatCases {
		t.Run(tc.name, func(t *testing.T) {
			kind := kindOf(t, tc.manifest)
			moatObj, upObj := newPair(t, kind)

			if err := yaml.UnmarshalStrict([]byte(tc.manifest), moatObj); err != nil {
				t.Fatalf("strict decode into Moat's %s: %v", kind, err)
			}
			upErr := yaml.UnmarshalStrict([]byte(tc.manifest), upObj)
			if tc.moatOnly {
				if upErr == nil {
					t.Fatalf("upstream decoded a Moat-only manifest strictly; the case is mislabelled")
				}
				if err := yaml.Unmarshal([]byte(tc.manifest), upObj); err != nil {
					t.Fatalf("lenient decode into upstream's %s: %v", kind, err)
				}
			} else if upErr != nil {
				t.Fatalf("strict decode into upstream's %s: %v", kind, upErr)
			}

			moatJSON := mustJSON(t, moatObj)
			upJSON := mustJSON(t, upObj)

			// Moat loses nothing that was written.
			input := generic(t, mustYAMLToJSON(t, tc.manifest))
			if missing := missingFrom(input, generic(t, moatJSON), ""); len(missing) > 0 {
				t.Errorf("Moat's encoding dropped input fields: %v", missing)
			}

			// Same bytes as upstream once Moat-only fields are removed.
			moatShared := generic(t, moatJSON)
			removed := dropIngressNPEP127(moatShared)
			if tc.moatOnly && removed == 0 {
				t.Errorf("Moat-only case has no ingress networks/nodes after decoding")
			}
			if !tc.moatOnly && removed != 0 {
				t.Errorf("case not marked Moat-only has %d ingress networks/nodes peers", removed)
			}
			if diff := cmp.Diff(generic(t, upJSON), moatShared); diff != "" {
				t.Errorf("re-encoded JSON differs, upstream (-) vs Moat (+):\n%s", diff)
			}

			// Each side's output is accepted strictly by the other.
			moatBack, upBack := newPair(t, kind)
			if err := yaml.UnmarshalStrict(upJSON, moatBack); err != nil {
				t.Fatalf("strict decode of upstream's JSON into Moat: %v", err)
			}
			if diff := cmp.Diff(generic(t, upJSON), generic(t, mustJSON(t, moatBack))); diff != "" {
				t.Errorf("upstream -> Moat -> JSON changed (-want +got):\n%s", diff)
			}
			sharedJSON, err := json.Marshal(moatShared)
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.UnmarshalStrict(sharedJSON, upBack); err != nil {
				t.Errorf("strict decode of Moat's shared JSON into upstream: %v", err)
			}
		})
	}
}

// TestGoShapeMatchesUpstream walks upstream's types by reflection and
// requires Moat's to have the same Go type names, field names, JSON tags and
// kinds, and no extra fields except the NPEP-127 ingress peers. This keeps
// code written against upstream's Go API compiling against Moat's.
func TestGoShapeMatchesUpstream(t *testing.T) {
	extra := map[string]bool{
		"ClusterNetworkPolicyIngressPeer.Networks": true,
		"ClusterNetworkPolicyIngressPeer.Nodes":    true,
	}
	seen := map[string]bool{}
	var walk func(up, mo reflect.Type, path string)
	walk = func(up, mo reflect.Type, path string) {
		if up.Kind() != mo.Kind() {
			t.Errorf("%s: kind %s upstream, %s in Moat", path, up.Kind(), mo.Kind())
			return
		}
		switch up.Kind() {
		case reflect.Pointer, reflect.Slice:
			walk(up.Elem(), mo.Elem(), path+"[]")
			return
		case reflect.Map:
			walk(up.Key(), mo.Key(), path+"{key}")
			walk(up.Elem(), mo.Elem(), path+"{}")
			return
		}
		if up.PkgPath() != reflect.TypeOf(upstream.ClusterNetworkPolicy{}).PkgPath() {
			// Types from other packages (metav1, builtins) must be the
			// very same type.
			if up != mo {
				t.Errorf("%s: type %s upstream, %s in Moat", path, up, mo)
			}
			return
		}
		if up.Name() != mo.Name() {
			t.Errorf("%s: type name %s upstream, %s in Moat", path, up.Name(), mo.Name())
		}
		if seen[up.Name()] || up.Kind() != reflect.Struct {
			return
		}
		seen[up.Name()] = true
		for i := range up.NumField() {
			uf := up.Field(i)
			mf, ok := mo.FieldByName(uf.Name)
			if !ok {
				t.Errorf("%s.%s: missing in Moat", up.Name(), uf.Name)
				continue
			}
			if uf.Tag != mf.Tag {
				t.Errorf("%s.%s: tag %q upstream, %q in Moat", up.Name(), uf.Name, uf.Tag, mf.Tag)
			}
			if uf.Anonymous != mf.Anonymous {
				t.Errorf("%s.%s: embedded mismatch", up.Name(), uf.Name)
			}
			walk(uf.Type, mf.Type, up.Name()+"."+uf.Name)
		}
		for i := range mo.NumField() {
			name := mo.Name() + "." + mo.Field(i).Name
			if _, ok := up.FieldByName(mo.Field(i).Name); !ok && !extra[name] {
				t.Errorf("%s: Moat has a field upstream lacks", name)
			}
		}
	}
	walk(reflect.TypeOf(upstream.ClusterNetworkPolicy{}), reflect.TypeOf(moat.ClusterNetworkPolicy{}), "ClusterNetworkPolicy")
	walk(reflect.TypeOf(upstream.ClusterNetworkPolicyList{}), reflect.TypeOf(moat.ClusterNetworkPolicyList{}), "ClusterNetworkPolicyList")

	for _, n := range []string{"ClusterNetworkPolicySpec", "ClusterNetworkPolicySubject", "ClusterNetworkPolicyIngressRule",
		"ClusterNetworkPolicyEgressRule", "ClusterNetworkPolicyIngressPeer", "ClusterNetworkPolicyEgressPeer", "NamespacedPod",
		"ClusterNetworkPolicyProtocol", "ClusterNetworkPolicyProtocolTCP", "ClusterNetworkPolicyProtocolUDP",
		"ClusterNetworkPolicyProtocolSCTP", "Port", "PortRange", "ClusterNetworkPolicyStatus"} {
		if !seen[n] {
			t.Errorf("walk never reached %s; the comparison is incomplete", n)
		}
	}
	for name := range extra {
		typ, field, _ := strings.Cut(name, ".")
		if typ != "ClusterNetworkPolicyIngressPeer" {
			continue
		}
		mf, ok := reflect.TypeOf(moat.ClusterNetworkPolicyIngressPeer{}).FieldByName(field)
		eg, _ := reflect.TypeOf(moat.ClusterNetworkPolicyEgressPeer{}).FieldByName(field)
		if !ok || mf.Type != eg.Type || mf.Tag != eg.Tag {
			t.Errorf("ingress %s must mirror egress %s (type %v tag %q)", field, field, eg.Type, eg.Tag)
		}
	}
}

// TestConstantsMatchUpstream pins the enum values.
func TestConstantsMatchUpstream(t *testing.T) {
	pairs := [][2]string{
		{string(moat.AdminTier), string(upstream.AdminTier)},
		{string(moat.BaselineTier), string(upstream.BaselineTier)},
		{string(moat.ClusterNetworkPolicyRuleActionAccept), string(upstream.ClusterNetworkPolicyRuleActionAccept)},
		{string(moat.ClusterNetworkPolicyRuleActionDeny), string(upstream.ClusterNetworkPolicyRuleActionDeny)},
		{string(moat.ClusterNetworkPolicyRuleActionPass), string(upstream.ClusterNetworkPolicyRuleActionPass)},
		{moat.GroupName, upstream.GroupName},
		{moat.SchemeGroupVersion.String(), upstream.GroupVersion.String()},
	}
	for _, p := range pairs {
		if p[0] != p[1] {
			t.Errorf("Moat %q != upstream %q", p[0], p[1])
		}
	}
}

func kindOf(t *testing.T, manifest string) string {
	t.Helper()
	var tm struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal([]byte(manifest), &tm); err != nil {
		t.Fatalf("read kind: %v", err)
	}
	return tm.Kind
}

func newPair(t *testing.T, kind string) (any, any) {
	t.Helper()
	switch kind {
	case "ClusterNetworkPolicy":
		return &moat.ClusterNetworkPolicy{}, &upstream.ClusterNetworkPolicy{}
	case "ClusterNetworkPolicyList":
		return &moat.ClusterNetworkPolicyList{}, &upstream.ClusterNetworkPolicyList{}
	}
	t.Fatalf("unexpected kind %q", kind)
	return nil, nil
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b
}

func mustYAMLToJSON(t *testing.T, y string) []byte {
	t.Helper()
	b, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatalf("YAML to JSON: %v", err)
	}
	return b
}

func generic(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode generic: %v", err)
	}
	return m
}

// missingFrom lists the paths of values in want that got lacks or changes.
func missingFrom(want, got any, path string) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{path}
		}
		var out []string
		for k, v := range w {
			out = append(out, missingFrom(v, g[k], path+"."+k)...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{path}
		}
		var out []string
		for i := range w {
			out = append(out, missingFrom(w[i], g[i], path+"[]")...)
		}
		return out
	default:
		if !reflect.DeepEqual(want, got) {
			return []string{path}
		}
		return nil
	}
}

// dropIngressNPEP127 removes ingress peers' networks/nodes (in a policy or
// in every item of a list) and returns how many peers it emptied, so the
// rest can be compared with upstream, which drops them on decode.
func dropIngressNPEP127(obj map[string]any) int {
	if items, ok := obj["items"].([]any); ok {
		n := 0
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				n += dropIngressNPEP127(m)
			}
		}
		return n
	}
	spec, _ := obj["spec"].(map[string]any)
	rules, _ := spec["ingress"].([]any)
	n := 0
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		peers, _ := rule["from"].([]any)
		for _, p := range peers {
			peer, _ := p.(map[string]any)
			for _, f := range []string{"networks", "nodes"} {
				if _, ok := peer[f]; ok {
					delete(peer, f)
					n++
				}
			}
		}
	}
	return n
}
