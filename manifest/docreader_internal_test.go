package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
	"github.com/moat-net/moat/internal/clustergen"
)

// docReader splits a stream into the documents kubectl's YAMLReader gives
// (line ends, separators with comments, a missing last newline, lines
// longer than the buffer, "\r\n" across its end), and the input offsets it
// keeps read the same text again.
func TestDocReaderAsYAMLReader(t *testing.T) {
	long := strings.Repeat("x", 70<<10)
	for _, in := range []string{
		"",
		"\n",
		"a: 1",
		"a: 1\n---\nb: 2\n",
		"---\na: 1\n--- # two\nb: 2\n---\n",
		"---\n---\n\n---\na: 1\n",
		"a: 1\r\nb: |\r\n  x\r\n\r\n---\r\nc: 3\r\n",
		"a: \"\r\"\rb\r",
		"a: " + long + "\nb: 2\n",
		"a: " + strings.Repeat("y", 64<<10-4) + "\r\n" + "b: 2\r\n",
		"items:\n- a: 1\n---x\n",
		"----\n",
		"a: 1\n--- |\n  b\n",
		"# only a comment\n---\n",
	} {
		var want []string
		var wantErr error
		yr := yaml.NewYAMLReader(bufio.NewReader(strings.NewReader(in)))
		for {
			doc, err := yr.Read()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					wantErr = err
				}
				break
			}
			want = append(want, string(doc))
		}
		for _, at := range []io.ReaderAt{nil, strings.NewReader(in)} {
			r := &docReader{br: bufio.NewReaderSize(strings.NewReader(in), 16), at: at}
			var got []string
			var err error
			for {
				var d *yamlDoc
				if d, err = r.next(); err != nil {
					break
				}
				if !d.held {
					t.Fatalf("%q: a document without items not held", in)
				}
				again, rerr := readLines(nil, strings.NewReader(in), span{d.start, d.end})
				if rerr != nil || string(again) != string(d.text) {
					t.Errorf("%q: read again %q, %v; read %q", in, again, rerr, d.text)
				}
				got = append(got, string(d.text))
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) || (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
				t.Errorf("%q (at %v): documents %q, error %v; YAMLReader %q, %v", in, at != nil, got, err, want, wantErr)
			}
		}
	}
}

// The items of a List in a file are not held while it is read (review:
// reading a 43 MB dump held its text whole, about 0.25 GB at the peak):
// the document reader keeps its top-level members only, the batches are
// read again from the file, and the result is the whole conversion's.
func TestYAMLListFileItemsNotHeld(t *testing.T) {
	var buf bytes.Buffer
	g := clustergen.Generate(clustergen.Config{Nodes: 3, Namespaces: 10, Pods: 120, NetworkPolicies: 20, ClusterPolicies: 4, Seed: 3})
	if err := g.WriteJSON(&buf, clustergen.Kubectl); err != nil {
		t.Fatal(err)
	}
	doc, err := sigsyaml.JSONToYAML(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	crlf := bytes.ReplaceAll(doc, []byte("\n"), []byte("\r\n"))
	for name, content := range map[string][]byte{"dump.yaml": doc, "crlf.yaml": crlf, "two.yaml": append(append([]byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: first}\n---\n"), doc...), "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: last}\n"...)} {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, content, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, r := range []*docReader{{br: bufio.NewReader(f), at: f}, {br: bufio.NewReader(bytes.NewReader(content))}} {
			for {
				d, err := r.next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(d.text) > 1<<10 {
					t.Errorf("%s (at %v): %d bytes of a document held in one buffer (held whole: %v)", name, r.at != nil, len(d.text), d.held)
				}
			}
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		res := &decode.Result{}
		streamed, err := decodeYAMLAt(res, name, bufio.NewReader(f), f, 1)
		if err != nil || streamed != 1 {
			t.Fatalf("%s: %v, %d Lists read in batches, want 1", name, err, streamed)
		}
		// Each document converted whole, as before Lists were split.
		whole := &decode.Result{}
		yr := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(content)))
		for n := 1; ; n++ {
			raw, err := yr.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			js, err := yamlToJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			if err := whole.DecodeJSONBytes(fmt.Sprintf("%s#%d", name, n), js); err != nil {
				t.Fatal(err)
			}
		}
		// Without at (stdin), the items are held in chunks, still read in
		// batches: the same result.
		held := &decode.Result{}
		if streamed, err := decodeYAMLAt(held, name, bufio.NewReader(bytes.NewReader(content)), nil, 1); err != nil || streamed != 1 {
			t.Fatalf("%s without at: %v, %d Lists read in batches, want 1", name, err, streamed)
		}
		if !sameResult(held, whole) {
			t.Errorf("%s: read without at differs", name)
		}
		if !sameResult(res, whole) {
			t.Errorf("%s: read from the file:\n%v %v\nread whole:\n%v %v", name, res.Diagnostics, res.Dropped, whole.Diagnostics, whole.Dropped)
		}
	}
}
