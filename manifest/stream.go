package manifest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"

	goyaml "go.yaml.in/yaml/v2"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/moat-net/moat/decode"
)

// decodeStream reads one file or stdin. JSON (what `kubectl get -o json`
// prints, one or more values) is decoded as it streams; anything else is
// multi-document YAML, converted to JSON a document at a time, and the
// items of a List a batch at a time (yamllist.go). at, if not nil, reads
// r's bytes at their offsets (a file opened for this): a List's items are
// then not held in memory but read again a batch at a time.
func decodeStream(res *decode.Result, name string, r io.Reader, at io.ReaderAt) error {
	br := bufio.NewReaderSize(r, 64<<10)
	if looksLikeJSON(br) {
		return res.DecodeJSON(name, br)
	}
	_, err := decodeYAMLAt(res, name, br, at, 1)
	return err
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
	_, err := decodeYAMLAt(res, name, r, nil, first)
	return err
}

// decodeYAMLAt is decodeYAML, where at (if not nil) reads r's bytes at
// their offsets from r's start. Each document's text is held while it is
// read, as the YAML converter needs it, except a List's items: with at,
// those are read again from at a batch at a time, so memory holds one
// document's top-level members and a few batches rather than a cluster
// dump's text (tens of megabytes, grown in a buffer, which with the
// garbage collector's headroom more than doubled the peak: see
// BENCHMARKS.md); without at, they are held in chunks (no growing
// buffer's copies). A document that turns out not to be read in batches
// is read whole again. streamed counts the Lists read in batches.
//
// The input is read twice, so a file rewritten in place while it is
// read could give pieces of two versions: as when reading it once while
// it changes, the conversion or the decoding then fails or reads what
// the bytes say.
func decodeYAMLAt(res *decode.Result, name string, r *bufio.Reader, at io.ReaderAt, first int) (streamed int, err error) {
	docs := &docReader{br: r, at: at}
	for doc := first; ; doc++ {
		d, err := docs.next()
		if errors.Is(err, io.EOF) {
			return streamed, nil
		}
		if err != nil {
			return streamed, fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		source := fmt.Sprintf("%s#%d", name, doc)
		raw := d.text
		if d.held {
			if commentsOnly(raw) {
				continue
			}
			if decodeYAMLList(res, source, raw) {
				continue
			}
		} else {
			read, end := at2batch(at), d.end
			if d.items != nil {
				read, end = d.items.batch, d.items.n
			}
			if d.list.finish(end) {
				if token, ok := newToken(); ok {
					split := listSplit{head: headWith(raw[:d.cut], raw[d.cut:], token), token: token, batches: d.list.batches}
					if decodeListSplit(res, source, split, read) {
						streamed++
						continue
					}
				}
			}
			if raw, err = d.whole(at); err != nil {
				return streamed, fmt.Errorf("%s: document %d: read again: %w", name, doc, err)
			}
		}
		js, err := yamlToJSON(raw)
		if err != nil {
			return streamed, fmt.Errorf("%s: document %d: invalid YAML: %w%s", name, doc, err, templateHint(raw))
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		if err := res.DecodeJSONBytes(source, js); err != nil {
			return streamed, fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
	}
}

// docReader splits a YAML stream into documents as kubectl does
// (k8s.io/apimachinery's YAMLReader: a line starting with "---" ends a
// document, and must hold nothing else but blanks and a comment; a line's
// end, "\n" or "\r\n", is given as "\n", and one is added to the last
// line), keeping its offsets in the input.
type docReader struct {
	br   *bufio.Reader
	at   io.ReaderAt
	off  int64  // input offset of br's next byte
	line []byte // the last line read
}

// yamlDoc is one document as read.
type yamlDoc struct {
	// text is the document, or, when held is false, its lines but the
	// items of a List, the items: line included, which stood at
	// text[cut:]. Those lines are read again from at, or, without at,
	// kept in items.
	text       []byte
	held       bool
	cut        int
	items      *chunks
	list       listShape // followed while reading (offsets in items without at)
	start, end int64     // the document's lines in the input
}

// whole returns the whole document's text.
func (d *yamlDoc) whole(at io.ReaderAt) ([]byte, error) {
	if d.held {
		return d.text, nil
	}
	if d.items == nil {
		return readLines(nil, at, span{d.start, d.end})
	}
	raw := make([]byte, 0, int64(len(d.text))+d.items.n)
	raw = append(raw, d.text[:d.cut]...)
	for _, b := range d.items.bufs {
		raw = append(raw, b...)
	}
	return append(raw, d.text[d.cut:]...), nil
}

// chunks holds the lines of a List's items read from a stream that
// cannot be read again (stdin, a pipe), in chunks of about a megabyte:
// the items are held, but without one growing buffer's copies, and the
// document whole only if it is not read in batches after all.
type chunks struct {
	bufs [][]byte
	n    int64
}

func (c *chunks) add(line []byte) {
	if k := len(c.bufs); k == 0 || cap(c.bufs[k-1])-len(c.bufs[k-1]) < len(line) {
		size := 64 << 10 // a small List's items fit the first
		if k > 0 {
			size = min(2*cap(c.bufs[k-1]), 1<<20)
		}
		c.bufs = append(c.bufs, make([]byte, 0, max(size, len(line))))
	}
	k := len(c.bufs) - 1
	c.bufs[k] = append(c.bufs[k], line...)
	c.n += int64(len(line))
}

// batch is a batchReader: the lines in s, as added.
func (c *chunks) batch(dst []byte, s span) ([]byte, error) {
	off := s.start
	for _, b := range c.bufs {
		if off >= int64(len(b)) {
			off -= int64(len(b))
			continue
		}
		take := min(int64(len(b))-off, s.end-s.start)
		dst = append(dst, b[off:off+take]...)
		s.start += take
		off = 0
		if s.start == s.end {
			return dst, nil
		}
	}
	if s.start < s.end {
		return nil, io.ErrUnexpectedEOF
	}
	return dst, nil
}

// next returns the next document that holds a line, or io.EOF.
func (r *docReader) next() (*yamlDoc, error) {
	d := &yamlDoc{held: true, list: newListShape()}
	lines := 0
	for {
		start := r.off
		line, err := r.readLine()
		if err != nil && err != io.EOF {
			return nil, err
		}
		if rest, ok := bytes.CutPrefix(line, []byte("---")); ok {
			trimmed := bytes.TrimSpace(rest)
			if len(trimmed) > 0 && trimmed[0] != '#' {
				return nil, fmt.Errorf("invalid Yaml document separator: %s", trimmed)
			}
			if lines > 0 {
				return d, nil
			}
			if err == io.EOF {
				return nil, io.EOF
			}
		}
		if err == io.EOF {
			if lines > 0 {
				return d, nil
			}
			return nil, io.EOF
		}
		if lines == 0 {
			d.start = start
		}
		lines++
		d.end = r.off
		off, end := start, r.off
		if r.at == nil {
			if d.items == nil {
				d.items = &chunks{}
			}
			off, end = d.items.n, d.items.n+int64(len(line))
		}
		d.list.line(line, off, end)
		if d.list.inItems() {
			if d.held {
				d.held, d.cut = false, len(d.text)
			}
			if r.at == nil {
				d.items.add(line)
			}
			continue
		}
		d.text = append(d.text, line...)
	}
}

// readLine returns the next line as YAMLReader's LineReader does: its
// end replaced by "\n", "\n" alone with io.EOF at the end of the input.
func (r *docReader) readLine() ([]byte, error) {
	r.line = r.line[:0]
	for {
		frag, err := r.br.ReadSlice('\n')
		r.off += int64(len(frag))
		r.line = append(r.line, frag...)
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == nil:
			l := bytes.TrimSuffix(r.line[:len(r.line)-1], []byte("\r"))
			return append(l, '\n'), nil
		case err == io.EOF && len(r.line) > 0:
			return append(r.line, '\n'), nil
		default:
			return append(r.line, '\n'), err
		}
	}
}

// at2batch reads batches from at.
func at2batch(at io.ReaderAt) batchReader {
	return func(dst []byte, s span) ([]byte, error) { return readLines(dst, at, s) }
}

// readLines appends the input's lines in s to dst as docReader gives
// them: each line's end "\n", and "\n" added to a last line without one.
func readLines(dst []byte, at io.ReaderAt, s span) ([]byte, error) {
	n := int(s.end - s.start)
	from := len(dst)
	dst = slices.Grow(dst, n+1)[:from+n]
	if m, err := at.ReadAt(dst[from:], s.start); m < n {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	// Lines ending in "\r\n" lose the "\r": compact in place.
	w := from
	for i := from; i < len(dst); i++ {
		if dst[i] == '\r' && i+1 < len(dst) && dst[i+1] == '\n' {
			continue
		}
		dst[w] = dst[i]
		w++
	}
	dst = dst[:w]
	if w == from || dst[w-1] != '\n' {
		dst = append(dst, '\n')
	}
	return dst, nil
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
