package manifest

import (
	"strings"
	"testing"
)

// YAML is converted as kubectl converts it, except that a key set twice in
// one mapping is refused (ambiguous): a key a merge key brings in and the
// mapping sets again is an override, which kubectl accepts. Errors do not
// print Go values, and an unrendered template gets a hint.
func TestYAMLToJSON(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		json      string // the conversion, when it succeeds
		err       string // what the error says, when it fails
	}{
		{"plain", "a: 1\nb: [u, v]", `{"a":1,"b":["u","v"]}`, ""},
		{"merge key override", "p: &p {port: 80, protocol: TCP}\nq:\n  <<: *p\n  port: 81", `{"p":{"port":80,"protocol":"TCP"},"q":{"port":81,"protocol":"TCP"}}`, ""},
		{"merge key in a list item", "ports:\n- &p {port: 80}\n- <<: *p\n  port: 81\n  endPort: 90", `{"ports":[{"port":80},{"endPort":90,"port":81}]}`, ""},
		{"merge of a list of anchors", "a: &a {u: 1}\nb: &b {v: 2}\nc:\n  <<: [*a, *b]\n  v: 3", `{"a":{"u":1},"b":{"v":2},"c":{"u":1,"v":3}}`, ""},
		{"merge key after the key it overrides", "p: &p {port: 80}\nq:\n  port: 81\n  <<: *p", "", "key q.port is overridden by a merge key (<<) after it"},
		{"merge key after a nested key it overrides", "p: &p {s: {a: 1}}\nq:\n  s: {a: 2}\n  <<: *p", "", "key q.s.a is overridden by a merge key"},
		{"merge key after keys it does not bring in", "p: &p {port: 80}\nq:\n  protocol: TCP\n  <<: *p", `{"p":{"port":80},"q":{"port":80,"protocol":"TCP"}}`, ""},
		{"duplicate key", "a: 1\na: 2", "", `line 2: key "a" is set twice in one mapping`},
		{"duplicate key beside a merge key", "p: &p {port: 80}\nq:\n  <<: *p\n  port: 81\n  port: 82", "", "key q.port is set twice in one mapping"},
		{"duplicate key in a list item beside a merge key", "p: &p {port: 80}\nspec:\n  ports:\n  - {port: 1}\n  - {<<: *p, protocol: TCP, protocol: UDP}", "", "key spec.ports[1].protocol is set twice"},
		{"duplicate key in the anchored mapping", "p: &p {port: 80, port: 81}\nq:\n  <<: *p", "", "key p.port is set twice"},
		{"1 and \"1\" are one JSON key", "m: &m {port: 1}\nq:\n  <<: *m\n  port: 2\n  1: a\n  \"1\": b", "", "key q.1 is set twice"},
		{"quoted << is a plain key", "q:\n  '<<': 1\n  '<<': 2", "", "key q.<< is set twice"},
		{"duplicate keys", "a: 1\na: 2\nb: 1\nb: 2", "", `line 2: key "a" is set twice in one mapping; line 4: key "b" is set twice in one mapping`},
		{"template", "metadata:\n  name: {{ .Values.name }}", "", "a mapping used as a key (the document looks like a template: render it first"},
		{"list as a key", "? [a, b]\n: c", "", "a list used as a key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js, err := yamlToJSON([]byte(tc.doc))
			if err == nil && templateHint([]byte(tc.doc)) != "" {
				t.Fatalf("template converted: %s", js)
			}
			msg := ""
			if err != nil {
				msg = err.Error() + templateHint([]byte(tc.doc))
			}
			if tc.err == "" && (err != nil || string(js) != tc.json) {
				t.Errorf("got %s, %v; want %s", js, err, tc.json)
			}
			if tc.err != "" && !strings.Contains(msg, tc.err) {
				t.Errorf("got %s, error %q; want an error containing %q", js, msg, tc.err)
			}
			if strings.Contains(msg, "interface {}") {
				t.Errorf("error %q prints Go values", msg)
			}
		})
	}
}
