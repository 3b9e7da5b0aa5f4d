package matrix

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strings"

	"github.com/moat-net/moat/policy"
)

// The HTML page is one self-contained file: a namespace-by-namespace
// summary (allowed, partly, denied) with sticky headers, a filter, and
// drill-down to the pods of a pair of namespaces, every cell explained on
// hover. The matrix travels as data, not markup: each distinct explanation
// once, each distinct (egress, ingress) pair of them once, and one pair
// number per cell, gzip-compressed and base64-encoded, which the page
// inflates with the browser's DecompressionStream and renders. 50 pods on
// 5 ports is a few kilobytes; 500 pods stays usable, since only the summary
// and the opened pair of namespaces are ever in the document.

//go:embed html.tmpl
var pageSource string

var page = template.Must(template.New("matrix").Parse(pageSource))

// peerGroup is the summary row of the --peer addresses; the parentheses
// keep it apart from any namespace name.
const peerGroup = "(peers)"

// htmlData is what the page's script reads.
type htmlData struct {
	Ports  []string `json:"ports"`
	Groups []string `json:"groups"`
	// Names and Group describe each endpoint: its name within its group
	// (the pod name, or the address) and its group's index.
	Names []string `json:"names"`
	Group []int    `json:"group"`
	// Texts are the distinct explanations of one direction.
	Texts []string `json:"texts"`
	// Pairs are the distinct cells: [allowed (0 or 1), egress text,
	// ingress text].
	Pairs [][3]int `json:"pairs"`
	// Width is the bytes per cell number in Cells (2 or 4,
	// little-endian).
	Width int `json:"width"`
	// Cells is base64(gzip(pair number per cell)), port by port, then row
	// (source) by row, then column (destination).
	Cells string `json:"cells"`
}

// WriteHTML prints the matrix as one self-contained page (no external
// resources).
func WriteHTML(w io.Writer, r *Result) error {
	d, err := newHTMLData(r)
	if err != nil {
		return err
	}
	js, err := json.Marshal(d)
	if err != nil {
		return err
	}
	// json.Marshal escapes <, > and &, so the data cannot end the script
	// element it sits in.
	return page.Execute(w, struct {
		Data      template.JS
		Endpoints int
		Ports     string
	}{template.JS(js), len(r.Endpoints), strings.Join(d.Ports, ", ")})
}

func newHTMLData(r *Result) (*htmlData, error) {
	d := &htmlData{}
	for _, p := range r.Ports {
		d.Ports = append(d.Ports, p.String())
	}
	groups := map[string]int{}
	for _, e := range r.Endpoints {
		g, name := peerGroup, e
		if ns, pod, ok := strings.Cut(e, "/"); ok {
			g, name = ns, pod
		}
		gi, ok := groups[g]
		if !ok {
			gi = len(d.Groups)
			groups[g] = gi
			d.Groups = append(d.Groups, g)
		}
		d.Names = append(d.Names, name)
		d.Group = append(d.Group, gi)
	}
	// Decisions repeat across the matrix: key them without formatting.
	type textKey struct {
		dir, reason, passed string
		allowed             bool
		tier                policy.Tier
	}
	texts := map[textKey]int{}
	text := func(dir string, dec policy.Decision) int {
		k := textKey{dir: dir, reason: dec.Reason, allowed: dec.Allowed, tier: dec.Tier}
		if len(dec.Passed) > 0 {
			k.passed = strings.Join(dec.Passed, "\n")
		}
		i, ok := texts[k]
		if !ok {
			i = len(d.Texts)
			texts[k] = i
			d.Texts = append(d.Texts, explainDirection(dir, dec))
		}
		return i
	}
	pairs := map[[3]int]int{}
	cells := make([]uint32, len(r.Flows))
	for i, f := range r.Flows {
		allowed := 0
		if f.Allowed {
			allowed = 1
		}
		eg, in := f.Egress, f.Ingress
		for _, o := range f.OtherFamilies {
			// The cell is the first family's; say what the other does.
			in.Reason += fmt.Sprintf("\nover %s -> %s: %s (egress: %s; ingress: %s)", o.From, o.To, verdictWord(o.Allowed), o.Egress.Reason, o.Ingress.Reason)
		}
		key := [3]int{allowed, text("egress", eg), text("ingress", in)}
		pi, ok := pairs[key]
		if !ok {
			pi = len(d.Pairs)
			pairs[key] = pi
			d.Pairs = append(d.Pairs, key)
		}
		cells[i] = uint32(pi)
	}
	d.Width = 2
	if len(d.Pairs) > 1<<16 {
		d.Width = 4
	}
	raw := make([]byte, 0, len(cells)*d.Width)
	for _, c := range cells {
		if d.Width == 2 {
			raw = binary.LittleEndian.AppendUint16(raw, uint16(c))
		} else {
			raw = binary.LittleEndian.AppendUint32(raw, c)
		}
	}
	var z bytes.Buffer
	zw, err := gzip.NewWriterLevel(&z, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	d.Cells = base64.StdEncoding.EncodeToString(z.Bytes())
	return d, nil
}

func verdictWord(ok bool) string {
	if ok {
		return "ALLOWED"
	}
	return "DENIED"
}

// explainDirection is one direction's decision as `moat explain` prints it.
func explainDirection(dir string, d policy.Decision) string {
	word := "allow"
	if !d.Allowed {
		word = "deny"
	}
	s := fmt.Sprintf("%s %s [%s] %s", dir, word, d.Tier, d.Reason)
	for _, p := range d.Passed {
		s += "\n    passed by " + p
	}
	return s
}
