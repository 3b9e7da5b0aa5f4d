package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	goyaml "go.yaml.in/yaml/v2"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
)

// decodeStream reads one file or stdin. JSON (what `kubectl get -o json`
// prints, one or more values) is decoded as it streams; anything else is
// multi-document YAML, converted to JSON a document at a time, and the
// items of a List a batch at a time (yamllist.go).
func decodeStream(res *decode.Result, name string, r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	if looksLikeJSON(br) {
		return res.DecodeJSON(name, br)
	}
	return decodeYAML(res, name, br, 1)
}

// looksLikeJSON peeks at the first non-blank bytes: a JSON object starts
// with '{' then a quoted key or '}'. A YAML flow mapping ({a: b}) does not.
func looksLikeJSON(br *bufio.Reader) bool {
	for n := 64; ; n *= 2 {
		b, err := br.Peek(n)
		t := bytes.TrimLeft(b, " \t\r\n")
		if len(t) > 0 && t[0] != '{' {
			return false
		}
		if len(t) > 1 {
			u := bytes.TrimLeft(t[1:], " \t\r\n")
			if len(u) > 0 {
				return u[0] == '"' || u[0] == '}'
			}
		}
		if err != nil {
			return false
		}
	}
}

// decodeYAML splits a YAML stream into documents; first numbers the first.
func decodeYAML(res *decode.Result, name string, r *bufio.Reader, first int) error {
	reader := yaml.NewYAMLReader(r)
	for doc := first; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		if commentsOnly(raw) {
			continue
		}
		if decodeYAMLList(res, fmt.Sprintf("%s#%d", name, doc), raw) {
			continue
		}
		js, err := yamlToJSON(raw)
		if err != nil {
			return fmt.Errorf("%s: document %d: invalid YAML: %w%s", name, doc, err, templateHint(raw))
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		if err := res.DecodeJSONBytes(fmt.Sprintf("%s#%d", name, doc), js); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
	}
}

// yamlToJSON converts one YAML document as kubectl does, except that a key
// given twice in one mapping is refused: which of the two values the
// author meant is ambiguous, and kubectl would silently take the last.
// A key that a merge key (<<: *anchor) brings in and the mapping then
// sets again is an override, not a duplicate, and kubectl accepts it,
// but the strict conversion counts it as one; so when the strict
// conversion fails, the duplicates are looked for again among the keys
// written in each mapping, and the document converted as kubectl does
// if there are none.
func yamlToJSON(raw []byte) ([]byte, error) {
	js, err := sigsyaml.YAMLToJSONStrict(raw)
	if err == nil {
		return js, nil
	}
	if !bytes.Contains(raw, []byte("<<")) {
		return nil, readableYAMLError(err)
	}
	// Decoded into a MapSlice, every mapping keeps the keys written in
	// it, in order and duplicates included, without the keys a merge key
	// brings in (the decoder drops those when it fills a MapSlice):
	// exactly the keys to compare. A document that is not a mapping is
	// not an object; the strict error stands.
	var doc goyaml.MapSlice
	if goyaml.Unmarshal(raw, &doc) != nil {
		return nil, readableYAMLError(err)
	}
	if path := duplicateKey(doc, ""); path != "" {
		return nil, fmt.Errorf("key %s is set twice in one mapping: which value is meant is ambiguous", path)
	}
	// kubectl applies a merge key where it stands, so one written after
	// a key it also brings in overrides that key, where the YAML spec
	// says the written key wins: refused as ambiguous too.
	var merged any
	if goyaml.Unmarshal(raw, &merged) != nil {
		return nil, readableYAMLError(err)
	}
	if path := overriddenKey(doc, merged, ""); path != "" {
		return nil, fmt.Errorf("key %s is overridden by a merge key (<<) after it: which value is meant is ambiguous (write the merge key first)", path)
	}
	js, err = sigsyaml.YAMLToJSON(raw)
	if err != nil {
		return nil, readableYAMLError(err)
	}
	return js, nil
}

// duplicateKey returns the path of the first key set twice in one mapping
// of v (a document decoded into MapSlices), "" if none. Keys are compared
// as the JSON conversion writes them, so 1 and "1" are one key.
func duplicateKey(v any, path string) string {
	switch v := v.(type) {
	case goyaml.MapSlice:
		seen := make(map[string]bool, len(v))
		for _, it := range v {
			k := fmt.Sprint(it.Key)
			p := k
			if path != "" {
				p = path + "." + k
			}
			if seen[k] {
				return p
			}
			seen[k] = true
			if d := duplicateKey(it.Value, p); d != "" {
				return d
			}
		}
	case []any:
		for i, e := range v {
			if d := duplicateKey(e, fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
	}
	return ""
}

// overriddenKey returns the path of the first key written in the document
// (written, decoded into MapSlices) whose value is not the one the
// conversion kept (merged, decoded as the conversion decodes), "" if none.
func overriddenKey(written, merged any, path string) string {
	switch w := written.(type) {
	case goyaml.MapSlice:
		m, ok := merged.(map[any]any)
		if !ok {
			return path
		}
		for _, it := range w {
			p := fmt.Sprint(it.Key)
			if path != "" {
				p = path + "." + p
			}
			v, ok := m[it.Key]
			if !ok {
				return p
			}
			if d := overriddenKey(it.Value, v, p); d != "" {
				return d
			}
		}
	case []any:
		m, ok := merged.([]any)
		if !ok || len(m) != len(w) {
			return path
		}
		for i := range w {
			if d := overriddenKey(w[i], m[i], fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
	default:
		if !reflect.DeepEqual(written, merged) {
			return path
		}
	}
	return ""
}

// readableYAMLError rewords the YAML decoder's errors that print Go
// values: a mapping used as a key (what an unrendered template such as
// `name: {{ .Values.name }}` parses as) is shown as
// "map[interface {}]interface {}{...}".
func readableYAMLError(err error) error {
	msg := err.Error()
	if strings.Contains(msg, "invalid map key: map[") {
		return errors.New("a mapping used as a key")
	}
	if strings.Contains(msg, "invalid map key: []") {
		return errors.New("a list used as a key")
	}
	// "yaml: unmarshal errors:\n  line 3: key \"a\" already set in map"
	// is one line per duplicate: kept on one line.
	if rest, ok := strings.CutPrefix(msg, "yaml: unmarshal errors:\n"); ok {
		lines := strings.Split(rest, "\n")
		for i, l := range lines {
			lines[i] = strings.Replace(strings.TrimSpace(l), "already set in map", "is set twice in one mapping", 1)
		}
		return errors.New(strings.Join(lines, "; "))
	}
	return err
}

// templateHint is added to a YAML error when the document holds template
// markers, which are the likelier cause than a typo.
func templateHint(raw []byte) string {
	if bytes.Contains(raw, []byte("{{")) {
		return " (the document looks like a template: render it first, e.g. with helm template)"
	}
	return ""
}

// commentsOnly reports whether a document holds nothing but blank lines,
// comments and "---" lines. It reads the document in place: a cluster
// dump is one document of tens of megabytes.
func commentsOnly(b []byte) bool {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		t := bytes.TrimSpace(line)
		if len(t) > 0 && t[0] != '#' && !bytes.Equal(t, []byte("---")) {
			return false
		}
	}
	return true
}
