package v1alpha2_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/yaml"

	"github.com/moat-net/moat/deploy"
)

// verdict is what the API server does with an object under one channel's
// CRD: "" accepts it; any other string rejects it and must occur in the
// error text.
type verdict = string

const accept verdict = ""

// admissionCases exercise every validation rule of the CRDs by running
// objects through the API server's pruning, OpenAPI, list-type and CEL
// validation. Each case replaces spec.ingress or spec.egress (or the whole
// spec) of a valid base policy.
var admissionCases = []struct {
	name     string
	spec     string // YAML merged over the base spec's top-level keys
	standard verdict
	exp      verdict
}{
	{name: "valid base", spec: `{}`, standard: accept, exp: accept},
	{name: "priority 0 and Baseline", spec: `{priority: 0, tier: Baseline}`, standard: accept, exp: accept},
	{name: "priority 1001", spec: `{priority: 1001}`, standard: "should be less than or equal to 1000", exp: "should be less than or equal to 1000"},
	{name: "priority -1", spec: `{priority: -1}`, standard: "should be greater than or equal to 0", exp: "should be greater than or equal to 0"},
	{name: "unknown tier", spec: `{tier: Developer}`, standard: "Unsupported value", exp: "Unsupported value"},
	{name: "no tier", spec: `{tier: null}`, standard: "spec.tier: Required value", exp: "spec.tier: Required value"},
	{name: "empty subject", spec: `{subject: {}}`, standard: "should have at least 1 properties", exp: "should have at least 1 properties"},
	{name: "subject with both", spec: `{subject: {namespaces: {}, pods: {podSelector: {}}}}`, standard: "must have at most 1 item", exp: "must have at most 1 item"},
	{name: "pods subject without podSelector", spec: `{subject: {pods: {namespaceSelector: {}}}}`, standard: "podSelector: Required value", exp: "podSelector: Required value"},
	{name: "26 ingress rules", spec: `{ingress: ` + repeat(`{action: Deny, from: [{namespaces: {}}]}`, 26) + `}`, standard: "must have at most 25 items", exp: "must have at most 25 items"},
	{name: "25 egress rules", spec: `{egress: ` + repeat(`{action: Deny, to: [{namespaces: {}}]}`, 25) + `}`, standard: accept, exp: accept},
	{name: "unknown action", spec: `{ingress: [{action: Allow, from: [{namespaces: {}}]}]}`, standard: "Unsupported value", exp: "Unsupported value"},
	{name: "rule name 101 chars", spec: `{ingress: [{name: ` + strings.Repeat("n", 101) + `, action: Deny, from: [{namespaces: {}}]}]}`, standard: "may not be more than 100", exp: "may not be more than 100"},
	{name: "empty from", spec: `{ingress: [{action: Deny, from: []}]}`, standard: "should have at least 1 items", exp: "should have at least 1 items"},
	{name: "missing to", spec: `{egress: [{action: Deny}]}`, standard: "to: Required value", exp: "to: Required value"},
	{name: "26 peers", spec: `{egress: [{action: Deny, to: ` + repeat(`{namespaces: {}}`, 26) + `}]}`, standard: "must have at most 25 items", exp: "must have at most 25 items"},
	{name: "empty peer", spec: `{ingress: [{action: Deny, from: [{}]}]}`, standard: "should have at least 1 properties", exp: "should have at least 1 properties"},
	{name: "peer with two fields", spec: `{ingress: [{action: Deny, from: [{namespaces: {}, pods: {podSelector: {}}}]}]}`, standard: "must have at most 1 item", exp: "must have at most 1 item"},
	{name: "empty protocols", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: []}]}`, standard: "should have at least 1 items", exp: "should have at least 1 items"},
	{name: "26 protocols", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: ` + repeat(`{tcp: {destinationPort: {number: 80}}}`, 26) + `}]}`, standard: "must have at most 25 items", exp: "must have at most 25 items"},
	{name: "protocol with tcp and udp", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 1}}, udp: {destinationPort: {number: 1}}}]}]}`, standard: "must have at most 1 item", exp: "must have at most 1 item"},
	{name: "empty protocol entry", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{}]}]}`, standard: "should have at least 1 properties", exp: "should have at least 1 properties"},
	{name: "empty tcp", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {}}]}]}`, standard: "should have at least 1 properties", exp: "should have at least 1 properties"},
	{name: "port 0", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{udp: {destinationPort: {number: 0}}}]}]}`, standard: "should be greater than or equal to 1", exp: "should be greater than or equal to 1"},
	{name: "port 65536", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{sctp: {destinationPort: {number: 65536}}}]}]}`, standard: "should be less than or equal to 65535", exp: "should be less than or equal to 65535"},
	{name: "number and range", spec: `{ingress: [{action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 80, range: {start: 1, end: 2}}}}]}]}`, standard: "must have at most 1 item", exp: "must have at most 1 item"},
	{name: "range start == end", spec: `{egress: [{action: Deny, to: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 80, end: 80}}}}]}]}`, standard: "Start port must be less than End port", exp: "Start port must be less than End port"},
	{name: "range start > end", spec: `{egress: [{action: Deny, to: [{namespaces: {}}], protocols: [{udp: {destinationPort: {range: {start: 90, end: 80}}}}]}]}`, standard: "Start port must be less than End port", exp: "Start port must be less than End port"},
	{name: "range 1-65535", spec: `{egress: [{action: Deny, to: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 1, end: 65535}}}}]}]}`, standard: accept, exp: accept},
	{name: "range end 65536", spec: `{egress: [{action: Deny, to: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {range: {start: 1, end: 65536}}}}]}]}`, standard: "should be less than or equal to 65535", exp: "should be less than or equal to 65535"},
	{name: "egress networks v4 and v6", spec: `{egress: [{action: Accept, to: [{networks: ["10.0.0.0/8", "fd00::/8"]}]}]}`, standard: accept, exp: accept},
	{name: "egress invalid CIDR", spec: `{egress: [{action: Accept, to: [{networks: ["10.0.0.0/33"]}]}]}`, standard: "Invalid CIDR format provided", exp: "Invalid CIDR format provided"},
	{name: "egress bare IP is not a CIDR", spec: `{egress: [{action: Accept, to: [{networks: ["10.0.0.1"]}]}]}`, standard: "Invalid CIDR format provided", exp: "Invalid CIDR format provided"},
	{name: "egress 26 CIDRs", spec: `{egress: [{action: Accept, to: [{networks: ` + cidrs(26) + `}]}]}`, standard: "must have at most 25 items", exp: "must have at most 25 items"},
	{name: "egress 25 CIDRs", spec: `{egress: [{action: Accept, to: [{networks: ` + cidrs(25) + `}]}]}`, standard: accept, exp: accept},
	{name: "egress duplicate CIDR", spec: `{egress: [{action: Accept, to: [{networks: ["10.0.0.0/8", "10.0.0.0/8"]}]}]}`, standard: "Duplicate value", exp: "Duplicate value"},
	{name: "egress named port to pods", spec: `{egress: [{action: Accept, to: [{pods: {podSelector: {}}}], protocols: [{destinationNamedPort: http}]}]}`, standard: accept, exp: accept},
	// Upstream's standard channel has no named-port rule; only experimental does.
	{name: "egress named port to networks", spec: `{egress: [{action: Accept, to: [{networks: ["10.0.0.0/8"]}], protocols: [{destinationNamedPort: http}]}]}`, standard: accept, exp: "networks/nodes/domainNames peer cannot be set with namedPorts"},
	{name: "egress nodes", spec: `{egress: [{action: Deny, to: [{nodes: {matchLabels: {a: b}}}]}]}`, standard: "should have at least 1 properties", exp: accept},
	{name: "egress named port to nodes", spec: `{egress: [{action: Deny, to: [{namespaces: {}}, {nodes: {}}], protocols: [{destinationNamedPort: dns}]}]}`, standard: "should have at least 1 properties", exp: "networks/nodes/domainNames peer cannot be set with namedPorts"},
	{name: "egress domainNames", spec: `{egress: [{action: Accept, to: [{domainNames: ["kubernetes.io", "*.example.com"]}]}]}`, standard: "should have at least 1 properties", exp: accept},
	{name: "egress partial wildcard domain", spec: `{egress: [{action: Accept, to: [{domainNames: ["*foo.example.com"]}]}]}`, standard: "should have at least 1 properties", exp: "should match"},
	// NPEP-127: the standard channel prunes the unknown field, leaving an
	// empty peer that the one-of rule rejects, so nothing is silently widened.
	{name: "ingress networks", spec: `{ingress: [{action: Accept, from: [{networks: ["203.0.113.0/24", "2001:db8::/32"]}], protocols: [{tcp: {destinationPort: {number: 5432}}}]}]}`, standard: "should have at least 1 properties", exp: accept},
	{name: "ingress nodes", spec: `{ingress: [{action: Deny, from: [{nodes: {matchLabels: {kubernetes.io/hostname: worker-3}}}]}]}`, standard: "should have at least 1 properties", exp: accept},
	{name: "ingress invalid CIDR", spec: `{ingress: [{action: Deny, from: [{networks: ["300.0.0.0/8"]}]}]}`, standard: "should have at least 1 properties", exp: "Invalid CIDR format provided"},
	{name: "ingress 26 CIDRs", spec: `{ingress: [{action: Deny, from: [{networks: ` + cidrs(26) + `}]}]}`, standard: "should have at least 1 properties", exp: "must have at most 25 items"},
	{name: "ingress networks and nodes in one peer", spec: `{ingress: [{action: Deny, from: [{networks: ["10.0.0.0/8"], nodes: {}}]}]}`, standard: "should have at least 1 properties", exp: "must have at most 1 item"},
	{name: "ingress named port from networks", spec: `{ingress: [{action: Accept, from: [{networks: ["10.0.0.0/8"]}], protocols: [{destinationNamedPort: http}]}]}`, standard: "should have at least 1 properties", exp: "networks/nodes peer cannot be set with namedPorts"},
	{name: "ingress named port from nodes", spec: `{ingress: [{action: Accept, from: [{namespaces: {}}, {nodes: {}}], protocols: [{destinationNamedPort: http}]}]}`, standard: "should have at least 1 properties", exp: "networks/nodes peer cannot be set with namedPorts"},
	{name: "ingress named port from pods", spec: `{ingress: [{action: Accept, from: [{pods: {podSelector: {}}}], protocols: [{destinationNamedPort: http}]}]}`, standard: accept, exp: accept},
}

const admissionBase = `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admission}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {}}
  ingress:
  - {name: from-monitoring, action: Accept, from: [{namespaces: {matchLabels: {team: monitoring}}}], protocols: [{tcp: {destinationPort: {number: 9090}}}]}
`

// TestCRDAdmission runs objects through the API server's validation of
// custom resources with each channel's CRD, proving the rules are not just
// present but enforced as intended.
func TestCRDAdmission(t *testing.T) {
	admitters := map[deploy.Channel]*admitter{}
	for _, ch := range channels {
		admitters[ch] = newAdmitter(t, loadCRD(t, ch))
	}
	for _, tc := range admissionCases {
		for _, ch := range channels {
			want := tc.standard
			if ch == deploy.Experimental {
				want = tc.exp
			}
			t.Run(tc.name+"/"+string(ch), func(t *testing.T) {
				obj := admissionObject(t, tc.spec)
				pruned, errs := admitters[ch].admit(obj)
				got := errs.ToAggregate()
				switch {
				case want == accept && got != nil:
					t.Errorf("rejected (pruned %v): %v", pruned, got)
				case want != accept && got == nil:
					t.Errorf("accepted (pruned %v), want an error containing %q", pruned, want)
				case want != accept && !strings.Contains(got.Error(), want):
					t.Errorf("error %q does not contain %q", got, want)
				}
			})
		}
	}
}

// TestCRDAdmissionCompatCases: every manifest of the compatibility table is
// accepted by the experimental CRD unchanged (nothing pruned).
func TestCRDAdmissionCompatCases(t *testing.T) {
	a := newAdmitter(t, loadCRD(t, deploy.Experimental))
	for _, tc := range compatCases {
		if kindOf(t, tc.manifest) != "ClusterNetworkPolicy" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			obj := apiServerJSON(t, mustYAMLToJSON(t, tc.manifest))
			delete(obj, "status") // the status subresource is validated separately
			pruned, errs := a.admit(obj)
			if len(pruned) > 0 {
				t.Errorf("experimental CRD prunes %v", pruned)
			}
			if err := errs.ToAggregate(); err != nil {
				t.Errorf("experimental CRD rejects it: %v", err)
			}
		})
	}
}

func admissionObject(t *testing.T, specPatch string) map[string]any {
	t.Helper()
	obj := generic(t, mustYAMLToJSON(t, admissionBase))
	var patch map[string]any
	if err := yaml.Unmarshal([]byte(specPatch), &patch); err != nil {
		t.Fatalf("bad case YAML %q: %v", specPatch, err)
	}
	spec := obj["spec"].(map[string]any)
	for k, v := range patch {
		if v == nil {
			delete(spec, k)
			continue
		}
		spec[k] = v
	}
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return apiServerJSON(t, b)
}

// apiServerJSON decodes as the API server's unstructured decoder does:
// integers become int64, which CEL's integer comparisons require.
func apiServerJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := utiljson.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return m
}

func repeat(item string, n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = item
	}
	return "[" + strings.Join(items, ", ") + "]"
}

func cidrs(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("%q", fmt.Sprintf("10.%d.0.0/16", i))
	}
	return "[" + strings.Join(items, ", ") + "]"
}
