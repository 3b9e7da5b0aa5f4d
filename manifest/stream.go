package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
)

// decodeStream reads one file or stdin. JSON (what `kubectl get -o json`
// prints, one or more values) is decoded as it streams; anything else is
// multi-document YAML, converted to JSON a document at a time.
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
		if len(bytes.TrimSpace(stripComments(raw))) == 0 {
			continue
		}
		js, err := sigsyaml.YAMLToJSONStrict(raw)
		if err != nil {
			return fmt.Errorf("%s: document %d: invalid YAML: %w", name, doc, err)
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		if err := res.DecodeJSONBytes(fmt.Sprintf("%s#%d", name, doc), js); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		t := bytes.TrimSpace(line)
		if len(t) == 0 || t[0] == '#' || bytes.Equal(t, []byte("---")) {
			continue
		}
		out = append(out, line...)
		out = append(out, '\n')
	}
	return out
}
