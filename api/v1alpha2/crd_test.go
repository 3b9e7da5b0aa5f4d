package v1alpha2_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	moat "github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/deploy"
)

var channels = []deploy.Channel{deploy.Standard, deploy.Experimental}

// TestCRDsAreValid decodes each channel's CRD and runs the API server's own
// CRD validation on it (structural schema, CEL compilation and cost
// estimates), so a CRD the API server would refuse fails here first.
func TestCRDsAreValid(t *testing.T) {
	for _, ch := range channels {
		t.Run(string(ch), func(t *testing.T) {
			crd := loadCRD(t, ch)
			if errs := validateCRD(t, crd); len(errs) > 0 {
				t.Fatalf("API server would reject the %s CRD:\n%v", ch, errs.ToAggregate())
			}
			if got, want := crd.Name, "clusternetworkpolicies."+moat.GroupName; got != want {
				t.Errorf("name %q, want %q", got, want)
			}
			if crd.Spec.Group != moat.GroupName || crd.Spec.Scope != apiextensionsv1.ClusterScoped ||
				crd.Spec.Names.Kind != "ClusterNetworkPolicy" || crd.Spec.Names.ListKind != "ClusterNetworkPolicyList" ||
				!slices.Equal(crd.Spec.Names.ShortNames, []string{"cnp"}) {
				t.Errorf("group/scope/names wrong: %+v %s %+v", crd.Spec.Group, crd.Spec.Scope, crd.Spec.Names)
			}
			if len(crd.Spec.Versions) != 1 {
				t.Fatalf("%d versions, want 1", len(crd.Spec.Versions))
			}
			v := crd.Spec.Versions[0]
			if v.Name != moat.Version || !v.Served || !v.Storage {
				t.Errorf("version %q served=%v storage=%v", v.Name, v.Served, v.Storage)
			}
			if v.Subresources == nil || v.Subresources.Status == nil {
				t.Errorf("status subresource missing")
			}
			if got := crd.Annotations["policy.networking.k8s.io/channel"]; got != string(ch) {
				t.Errorf("channel annotation %q, want %q", got, ch)
			}
			if crd.Annotations[apiextensionsv1.KubeAPIApprovedAnnotation] == "" {
				t.Errorf("missing %s: the API server refuses *.k8s.io CRDs without it", apiextensionsv1.KubeAPIApprovedAnnotation)
			}
		})
	}
}

// TestCRDChannelFields checks which peer fields each channel has: the
// NPEP-127 ingress peers and the experimental egress peers exist only in
// the experimental channel.
func TestCRDChannelFields(t *testing.T) {
	want := map[deploy.Channel]map[string][]string{
		deploy.Standard: {
			"spec.ingress[].from[]": {"namespaces", "pods"},
			"spec.egress[].to[]":    {"namespaces", "networks", "pods"},
		},
		deploy.Experimental: {
			"spec.ingress[].from[]": {"namespaces", "networks", "nodes", "pods"},
			"spec.egress[].to[]":    {"domainNames", "namespaces", "networks", "nodes", "pods"},
		},
	}
	for _, ch := range channels {
		root := loadCRD(t, ch).Spec.Versions[0].Schema.OpenAPIV3Schema
		for path, fields := range want[ch] {
			s, ok := schemaAt(t, root, path)
			if !ok {
				t.Fatalf("%s: %s missing", ch, path)
			}
			var got []string
			for name := range s.Properties {
				got = append(got, name)
			}
			slices.Sort(got)
			if !slices.Equal(got, fields) {
				t.Errorf("%s channel %s: properties %v, want %v", ch, path, got, fields)
			}
		}
	}
	// The ingress peers mirror egress exactly.
	root := loadCRD(t, deploy.Experimental).Spec.Versions[0].Schema.OpenAPIV3Schema
	for _, f := range []string{"networks", "nodes"} {
		in, _ := schemaAt(t, root, "spec.ingress[].from[]."+f)
		eg, _ := schemaAt(t, root, "spec.egress[].to[]."+f)
		if in == nil || eg == nil {
			t.Fatalf("%s missing on ingress or egress", f)
		}
		a, b := *in, *eg
		a.Description, b.Description = "", ""
		if diff := cmp.Diff(b, a); diff != "" {
			t.Errorf("ingress %s differs from egress %s (-egress +ingress):\n%s", f, f, diff)
		}
	}
}

const namedPortRuleIngress = "!(self.from.exists(peer, has(peer.networks) || has(peer.nodes)) && has(self.protocols) && self.protocols.exists(protocol, has(protocol.destinationNamedPort)))"
const namedPortRuleEgress = "!(self.to.exists(peer, has(peer.networks) || has(peer.nodes) || has(peer.domainNames)) && has(self.protocols) && self.protocols.exists(protocol, has(protocol.destinationNamedPort)))"

// TestCRDValidationRules checks that the limits and CEL rules of upstream's
// API are in the schema of both channels, and the named-port rule only in
// experimental (for ingress as well as egress).
func TestCRDValidationRules(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	for _, ch := range channels {
		t.Run(string(ch), func(t *testing.T) {
			root := loadCRD(t, ch).Spec.Versions[0].Schema.OpenAPIV3Schema
			get := func(path string) *apiextensionsv1.JSONSchemaProps {
				s, ok := schemaAt(t, root, path)
				if !ok {
					t.Fatalf("%s missing", path)
				}
				return s
			}
			checkRange := func(path string, min, max float64) {
				s := get(path)
				if s.Minimum == nil || *s.Minimum != min || s.Maximum == nil || *s.Maximum != max {
					t.Errorf("%s: range [%v, %v], want [%v, %v]", path, ptrStr(s.Minimum), ptrStr(s.Maximum), min, max)
				}
			}
			checkItems := func(path string, min, max *int64) {
				s := get(path)
				if !eqPtr(s.MinItems, min) || !eqPtr(s.MaxItems, max) {
					t.Errorf("%s: items [%v, %v], want [%v, %v]", path, ptrStr(s.MinItems), ptrStr(s.MaxItems), ptrStr(min), ptrStr(max))
				}
			}
			checkOneOf := func(path string) {
				s := get(path)
				if !eqPtr(s.MinProperties, i(1)) || !eqPtr(s.MaxProperties, i(1)) {
					t.Errorf("%s: properties [%v, %v], want exactly one", path, ptrStr(s.MinProperties), ptrStr(s.MaxProperties))
				}
			}
			checkRule := func(path, rule, message string) {
				for _, r := range get(path).XValidations {
					if r.Rule == rule && r.Message == message {
						return
					}
				}
				t.Errorf("%s: CEL rule %q (%q) missing; have %+v", path, rule, message, get(path).XValidations)
			}
			checkEnum := func(path string, values ...string) {
				var got []string
				for _, e := range get(path).Enum {
					var s string
					if err := json.Unmarshal(e.Raw, &s); err != nil {
						t.Fatal(err)
					}
					got = append(got, s)
				}
				if !slices.Equal(got, values) {
					t.Errorf("%s: enum %v, want %v", path, got, values)
				}
			}

			checkEnum("spec.tier", "Admin", "Baseline")
			checkRange("spec.priority", 0, 1000)
			checkOneOf("spec.subject")
			for _, dir := range []struct{ rules, peers string }{{"spec.ingress", "from"}, {"spec.egress", "to"}} {
				rules := dir.rules
				checkItems(rules, nil, i(25))
				checkEnum(rules+"[].action", "Accept", "Deny", "Pass")
				if s := get(rules + "[].name"); !eqPtr(s.MaxLength, i(100)) {
					t.Errorf("%s[].name: maxLength %v, want 100", rules, ptrStr(s.MaxLength))
				}
				checkItems(rules+"[]."+dir.peers, i(1), i(25))
				checkOneOf(rules + "[]." + dir.peers + "[]")
				checkItems(rules+"[].protocols", i(1), i(25))
				checkOneOf(rules + "[].protocols[]")
				for _, proto := range []string{"tcp", "udp", "sctp"} {
					p := rules + "[].protocols[]." + proto
					if s := get(p); !eqPtr(s.MinProperties, i(1)) {
						t.Errorf("%s: minProperties %v, want 1", p, ptrStr(s.MinProperties))
					}
					port := p + ".destinationPort"
					checkOneOf(port)
					checkRange(port+".number", 1, 65535)
					checkRange(port+".range.start", 1, 65535)
					checkRange(port+".range.end", 1, 65535)
					checkRule(port+".range", "self.start < self.end", "Start port must be less than End port")
				}
			}
			cidrPaths := []string{"spec.egress[].to[].networks"}
			if ch == deploy.Experimental {
				cidrPaths = append(cidrPaths, "spec.ingress[].from[].networks")
			}
			for _, p := range cidrPaths {
				checkItems(p, i(1), i(25))
				if s := get(p); s.XListType == nil || *s.XListType != "set" {
					t.Errorf("%s: want x-kubernetes-list-type set", p)
				}
				items := get(p).Items.Schema
				if !eqPtr(items.MaxLength, i(43)) {
					t.Errorf("%s items: maxLength %v, want 43", p, ptrStr(items.MaxLength))
				}
				if !slices.ContainsFunc(items.XValidations, func(r apiextensionsv1.ValidationRule) bool {
					return r.Rule == "isCIDR(self)" && r.Message == "Invalid CIDR format provided"
				}) {
					t.Errorf("%s items: isCIDR rule missing", p)
				}
			}
			hasNamed := func(path, rule string) bool {
				return slices.ContainsFunc(get(path).XValidations, func(r apiextensionsv1.ValidationRule) bool { return r.Rule == rule })
			}
			in, eg := hasNamed("spec.ingress[]", namedPortRuleIngress), hasNamed("spec.egress[]", namedPortRuleEgress)
			if wantRule := ch == deploy.Experimental; in != wantRule || eg != wantRule {
				t.Errorf("named-port vs networks/nodes rule: ingress %v egress %v, want %v for %s", in, eg, wantRule, ch)
			}
		})
	}
}

// TestCRDsMatchUpstream compares the schemas, without descriptions, with
// the CRDs that sigs.k8s.io/network-policy-api v0.2.0 ships: the standard
// channel must be identical, the experimental one identical apart from the
// NPEP-127 ingress peers and their named-port rule. This catches any marker
// that differs from upstream's.
func TestCRDsMatchUpstream(t *testing.T) {
	dir := upstreamModuleDir(t)
	for _, ch := range channels {
		t.Run(string(ch), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "config", "crd", string(ch), "policy.networking.k8s.io_clusternetworkpolicies.yaml"))
			if err != nil {
				t.Fatalf("read upstream CRD: %v", err)
			}
			up := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.Unmarshal(data, up); err != nil {
				t.Fatalf("decode upstream CRD: %v", err)
			}
			mine := loadCRD(t, ch)
			upSchema := schemaWithoutDescriptions(t, up)
			mySchema := schemaWithoutDescriptions(t, mine)
			if ch == deploy.Experimental {
				spec := mySchema["properties"].(map[string]any)["spec"].(map[string]any)["properties"].(map[string]any)
				rule := spec["ingress"].(map[string]any)["items"].(map[string]any)
				peer := rule["properties"].(map[string]any)["from"].(map[string]any)["items"].(map[string]any)["properties"].(map[string]any)
				for _, f := range []string{"networks", "nodes"} {
					if _, ok := peer[f]; !ok {
						t.Fatalf("experimental ingress peer lacks %s", f)
					}
					delete(peer, f)
				}
				if rules, ok := rule["x-kubernetes-validations"].([]any); !ok || len(rules) != 1 {
					t.Fatalf("experimental ingress rule: want exactly the named-port CEL rule, got %v", rule["x-kubernetes-validations"])
				}
				delete(rule, "x-kubernetes-validations")
			}
			if diff := cmp.Diff(upSchema, mySchema); diff != "" {
				t.Errorf("%s schema differs from upstream v0.2.0 (-upstream +moat):\n%s", ch, diff)
			}
		})
	}
}

// schemaWithoutDescriptions returns the version's schema as generic JSON without
// descriptions, which are Moat's own wording.
func schemaWithoutDescriptions(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) map[string]any {
	t.Helper()
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("%d versions", len(crd.Spec.Versions))
	}
	b, err := json.Marshal(crd.Spec.Versions[0])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var strip func(any)
	strip = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			delete(x, "description")
			for _, c := range x {
				strip(c)
			}
		case []any:
			for _, c := range x {
				strip(c)
			}
		}
	}
	strip(m)
	return m["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
}

func upstreamModuleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/network-policy-api").Output()
	if err != nil {
		t.Fatalf("locate sigs.k8s.io/network-policy-api in the module cache (go list -m): %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatalf("sigs.k8s.io/network-policy-api is not downloaded; run go mod download")
	}
	return dir
}

func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func ptrStr[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
