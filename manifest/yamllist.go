package manifest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"sync"

	yaml3 "go.yaml.in/yaml/v3"

	"github.com/moat-net/moat/decode"
)

// A YAML List (`kubectl get -A -o yaml` prints a whole cluster as one
// document, kind: List) converted to JSON whole costs about 25 times its
// size in memory and time: the YAML decoder's tree, then a map per object,
// then the JSON, all of it at once, before decoding starts. So the items
// of a List written the way kubectl writes it (a block mapping whose
// `items:` key holds a block sequence) are converted a batch at a time,
// on every core, and streamed to the decoder as the one JSON value the
// whole conversion gives: the top-level members converted without the
// items, the items spliced in where the conversion puts them (keys sorted),
// byte for byte what converting the document whole gives. The decoder
// cannot tell the two apart, so nothing about meaning, strictness or
// diagnostics forks.
//
// A batch is converted as the document "items:\n<its lines>", so that
// nesting depth, and the line on which a key is set twice, are those of
// the whole document's conversion (YAML errors, whose line numbers would
// differ, are never reported from a batch: see below). The split is by
// lines: an item starts at a line holding `-` at the indentation of the
// first item, and the items end at the first line back at column 0. A line
// that looks like either but lies inside a quoted scalar that spans lines
// (YAML lets its continuation lines start at column 0) cuts that scalar,
// and its batch then fails to convert (the quote is left open). Before the
// items, such a scalar would hide the `items:` line itself: the top-level
// members are converted with that line replaced by `items: [<random
// token>]`, and the split is used only if the conversion's top-level
// items are exactly that token, which no input can know in advance.
//
// Read from a file (decodeYAMLAt with the file as its io.ReaderAt), the
// document's lines are followed as they are read (listShape) and its items
// are not kept: each batch is read again from the file at its offsets when
// its turn to convert comes, so that memory holds the top-level members,
// a few batches and their conversions, and the decoded objects, not the
// document's text (a cluster dump's tens of megabytes, grown in a buffer,
// which with the garbage collector's headroom more than doubled the
// peak). Read from stdin or a pipe, which cannot be read again, the items'
// lines are held, in chunks rather than one buffer grown by copying.
//
// Whenever the document is not of that shape, or a batch or the top-level
// members fail to convert, or decoding the stream fails, the document is
// converted and decoded whole, as every document was before (read again
// whole from the file, if its items were not kept): its result
// or error is then exactly the old one (DecodeJSONValue adds nothing to
// the Result before the whole value decoded). A document with an alias
// (`*name`) in any batch or in its top-level members, or a directive, is
// also converted whole: anchors and aliases may cross items, and the YAML
// decoder's bound on aliases (its defence against alias bombs) is a ratio
// over the whole document, which batches must not reset. An alias token
// lies on one line, so it lies in one batch or in the top-level members,
// and a batch that converts is read by the same scanner states as in the
// whole document: the checks together see every alias the whole
// conversion would.

// listBatchBytes is how many bytes of items one conversion takes.
const listBatchBytes = 64 << 10

// span is a range of input offsets.
type span struct{ start, end int64 }

// listSplit is a List document cut into its top-level members and its
// items.
type listSplit struct {
	head    []byte // the top-level members, items: [token] in the items' place
	token   string // the token
	batches []span // consecutive items, each batch whole lines
}

// listShape follows a document line by line and finds the items of a List
// written as kubectl writes it: the `items:` line, then lines of items
// (each starting with a dash at one indentation), up to the first line
// back at column 0. It is fed every line, with the input offsets where
// the line starts and ends, until settled.
type listShape struct {
	itemsAt    int64 // offset of the items: line, -1 before it
	itemsEnd   int64 // offset of the first line after the items, -1 before it
	indent     int   // of the items' dashes, -1 before the first
	batchStart int64
	batches    []span
	failed     bool // not of that shape, or a directive
}

func newListShape() listShape { return listShape{itemsAt: -1, itemsEnd: -1, indent: -1} }

// settled reports whether later lines can change nothing: the shape
// failed, or the items ended (what follows them is top-level members).
func (s *listShape) settled() bool { return s.failed || s.itemsEnd >= 0 }

// inItems reports whether the lines fed so far end inside the items: the
// items: line was seen and the items have not ended (or the shape failed
// after it).
func (s *listShape) inItems() bool { return s.itemsAt >= 0 && s.itemsEnd < 0 }

func (s *listShape) line(line []byte, off, end int64) {
	if s.settled() {
		return
	}
	content := bytes.TrimRight(line, " \r\n")
	ind := len(content) - len(bytes.TrimLeft(content, " "))
	blank := len(content) == ind || content[ind] == '#'
	dash := !blank && content[ind] == '-' && (len(content) == ind+1 || content[ind+1] == ' ')
	switch {
	case len(content) > 0 && content[0] == '%':
		s.failed = true // a directive
	case s.itemsAt < 0:
		if string(content) == "items:" {
			s.itemsAt = off
			s.batchStart = end // blank and comment lines before the first item go with it
		}
	case blank:
	case s.indent < 0:
		if !dash {
			s.failed = true // not a block sequence
			return
		}
		s.indent = ind
	case ind > s.indent:
	case ind == s.indent && dash:
		if off-s.batchStart >= listBatchBytes {
			s.batches = append(s.batches, span{s.batchStart, off})
			s.batchStart = off
		}
	case ind == 0:
		s.itemsEnd = off
	default:
		s.failed = true // items indented, then something less indented than them
	}
}

// finish ends the document at offset end; ok is false unless it is a
// List of that shape with at least one item line.
func (s *listShape) finish(end int64) (ok bool) {
	if s.failed || s.itemsAt < 0 || s.indent < 0 {
		return false
	}
	if s.itemsEnd < 0 {
		s.itemsEnd = end
	}
	s.batches = append(s.batches, span{s.batchStart, s.itemsEnd})
	return true
}

// splitYAMLList cuts raw (one document) at the items of a List written
// as kubectl writes it; ok is false for any other shape, or when raw
// holds a directive.
func splitYAMLList(raw []byte) (_ listSplit, ok bool) {
	s := newListShape()
	for off := 0; off < len(raw) && !s.settled(); {
		end := bytes.IndexByte(raw[off:], '\n')
		if end < 0 {
			end = len(raw)
		} else {
			end += off + 1
		}
		s.line(raw[off:end], int64(off), int64(end))
		off = end
	}
	if !s.finish(int64(len(raw))) {
		return listSplit{}, false
	}
	token, ok := newToken()
	if !ok {
		return listSplit{}, false
	}
	return listSplit{head: headWith(raw[:s.itemsAt], raw[s.itemsEnd:], token), token: token, batches: s.batches}, true
}

// newToken is a random token no input can know in advance.
func newToken() (string, bool) {
	var t [16]byte
	if _, err := rand.Read(t[:]); err != nil {
		return "", false
	}
	return "moat-" + hex.EncodeToString(t[:]), true
}

// headWith is a List's top-level members, before and after its items,
// with `items: [token]` in the items' place.
func headWith(before, after []byte, token string) []byte {
	head := make([]byte, 0, len(before)+len(after)+64)
	head = append(head, before...)
	head = append(head, "items: ["+token+"]\n"...)
	return append(head, after...)
}

// aliasFree reports whether the YAML document doc holds no alias: a
// cheap look for a '*' where an alias could start, and when there is one
// (a cron schedule '*/5 * * * *', a shell command's "ls *.log"), a parse
// that says for certain (yaml.v3's, whose scanner is libyaml's as the
// converter's is; a document it cannot parse counts as holding one).
func aliasFree(doc []byte) bool {
	if !mayHoldAlias(doc) {
		return true
	}
	var n yaml3.Node
	if yaml3.Unmarshal(doc, &n) != nil {
		return false
	}
	return !hasAlias(&n)
}

func hasAlias(n *yaml3.Node) bool {
	if n.Kind == yaml3.AliasNode {
		return true
	}
	for _, c := range n.Content {
		if hasAlias(c) {
			return true
		}
	}
	return false
}

// mayHoldAlias reports whether raw has a '*' where an alias could start
// (after a blank, a flow indicator or ':', or at a line's start): it
// over-reports ("a * b" in a plain scalar), never misses one.
func mayHoldAlias(raw []byte) bool {
	for i := 0; ; i++ {
		j := bytes.IndexByte(raw[i:], '*')
		if j < 0 {
			return false
		}
		i += j
		if i == 0 {
			return true
		}
		switch raw[i-1] {
		case ' ', '\t', '\n', '\r', '[', '{', ',', ':':
			return true
		}
	}
}

// decodeYAMLList decodes a List document a batch of items at a time (see
// above); ok is false, with r unchanged, when the caller is to convert it
// whole.
func decodeYAMLList(res *decode.Result, source string, raw []byte) (ok bool) {
	split, ok := splitYAMLList(raw)
	if !ok {
		return false
	}
	return decodeListSplit(res, source, split, func(dst []byte, s span) ([]byte, error) {
		return append(dst, raw[s.start:s.end]...), nil
	})
}

// batchReader appends a batch's lines (as the document reader gives
// them) to dst.
type batchReader func(dst []byte, s span) ([]byte, error)

// decodeListSplit decodes a List cut at its items, reading each batch of
// items through read when its turn comes; ok is false, with res
// unchanged, when the caller is to convert the document whole.
func decodeListSplit(res *decode.Result, source string, split listSplit, read batchReader) (ok bool) {
	if !aliasFree(split.head) {
		return false
	}
	head, err := yamlToJSON(split.head)
	if err != nil {
		return false
	}
	prefix, suffix, ok := spliceAt(head, split.token)
	if !ok {
		return false
	}
	conv := newBatchConverter(split.batches, read)
	defer conv.stop()
	in := &listReader{parts: [][]byte{prefix}, conv: conv, suffix: suffix}
	return res.DecodeJSONValue(source, in, head) == nil
}

// spliceAt finds the top-level member "items":["<token>"] of the JSON
// object js and returns what goes before the items and after them:
// `{...,"items":[` and `],...}`.
func spliceAt(js []byte, token string) (prefix, suffix []byte, ok bool) {
	want, _ := json.Marshal([]string{token})
	dec := json.NewDecoder(bytes.NewReader(js))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, false
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, nil, false
		}
		at := dec.InputOffset() // after the key
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, false
		}
		if k != "items" {
			continue
		}
		end := dec.InputOffset()
		if int(at)+1+len(want) != int(end) || js[at] != ':' || !bytes.Equal(js[at+1:end], want) {
			return nil, nil, false
		}
		return js[:at+2], js[end-1:], true
	}
	return nil, nil, false
}

// listReader is the JSON of the whole List: prefix, the batches' items
// separated by commas, suffix.
type listReader struct {
	parts  [][]byte
	conv   *batchConverter
	suffix []byte
	n      int // batches read
	done   bool
}

func (l *listReader) Read(p []byte) (int, error) {
	for len(l.parts) == 0 || len(l.parts[0]) == 0 {
		if len(l.parts) > 0 {
			l.parts = l.parts[1:]
			continue
		}
		if l.done {
			return 0, io.EOF
		}
		items, more, err := l.conv.next()
		switch {
		case err != nil:
			return 0, err
		case !more:
			l.parts, l.done = [][]byte{l.suffix}, true
		case l.n > 0:
			l.parts = [][]byte{{','}, items}
		default:
			l.parts = [][]byte{items}
		}
		l.n++
	}
	n := copy(p, l.parts[0])
	l.parts[0] = l.parts[0][n:]
	return n, nil
}

// batchConverter converts batches of items on every core, at most a few
// ahead of the reader, and gives them back in order.
type batchConverter struct {
	results chan chan converted
	quit    chan struct{}
	wg      sync.WaitGroup // the conversions started, and what starts them
}

type converted struct {
	items []byte // the items' JSON, comma-separated, without brackets
	err   error
}

func newBatchConverter(batches []span, read batchReader) *batchConverter {
	workers := runtime.GOMAXPROCS(0)
	c := &batchConverter{results: make(chan chan converted, 2*workers), quit: make(chan struct{})}
	sem := make(chan struct{}, workers)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(c.results)
		for _, b := range batches {
			res := make(chan converted, 1)
			select {
			case c.results <- res:
			case <-c.quit:
				return
			}
			select {
			case sem <- struct{}{}:
			case <-c.quit:
				return
			}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				defer func() { <-sem }()
				res <- convertBatch(b, read)
			}()
		}
	}()
	return c
}

// convertBatch converts "items:\n<batch>" and keeps the items.
func convertBatch(b span, read batchReader) converted {
	doc := make([]byte, 0, int64(len("items:\n"))+b.end-b.start+1)
	doc, err := read(append(doc, "items:\n"...), b)
	if err != nil {
		return converted{err: err}
	}
	if !aliasFree(doc) {
		return converted{err: errors.New("an alias in a batch of items")}
	}
	js, err := yamlToJSON(doc)
	if err != nil {
		return converted{err: err}
	}
	inner, ok := bytes.CutPrefix(js, []byte(`{"items":[`))
	if ok {
		inner, ok = bytes.CutSuffix(inner, []byte(`]}`))
	}
	if !ok || len(inner) == 0 {
		return converted{err: errors.New("a batch of items did not convert to a list")}
	}
	return converted{items: inner}
}

// next returns the next batch's items; more is false after the last.
func (c *batchConverter) next() (items []byte, more bool, err error) {
	res, ok := <-c.results
	if !ok {
		return nil, false, nil
	}
	r := <-res
	return r.items, true, r.err
}

// stop ends the conversions still to start (the reader stopped early)
// and waits for those under way, which may be reading the input.
func (c *batchConverter) stop() {
	close(c.quit)
	c.wg.Wait()
}
