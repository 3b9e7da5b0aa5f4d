package matrix

import (
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
func WriteHTML(w io.Writer, r *Result) error { return writeHTML(w, resultGrid{r}) }

// WriteHTML prints the page of WriteHTML, judging each pair of classes
// once: what it holds is the page's data (the compressed cells, the
// distinct explanations), not the flows.
func (m *Matrix) WriteHTML(w io.Writer) error { return writeHTML(w, m) }

func writeHTML(w io.Writer, g grid) error {
	d, err := newHTMLData(g)
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
	}{template.JS(js), len(g.labels()), strings.Join(d.Ports, ", ")})
}

func newHTMLData(g grid) (*htmlData, error) {
	d := &htmlData{}
	for _, p := range g.portList() {
		d.Ports = append(d.Ports, p.String())
	}
	groups := map[string]int{}
	for _, e := range g.labels() {
		gr, name := peerGroup, e
		if ns, pod, ok := strings.Cut(e, "/"); ok {
			gr, name = ns, pod
		}
		gi, ok := groups[gr]
		if !ok {
			gi = len(d.Groups)
			groups[gr] = gi
			d.Groups = append(d.Groups, gr)
		}
		d.Names = append(d.Names, name)
		d.Group = append(d.Group, gi)
	}
	// Cell numbers are written as they are found, two bytes each; past
	// 65,536 distinct cells (rare: each takes an explanation of its own)
	// the cells are numbered again at four bytes.
	for _, width := range []int{2, 4} {
		cells, ok, err := htmlCells(g, d, width)
		if err != nil {
			return nil, err
		}
		if ok {
			d.Width, d.Cells = width, cells
			return d, nil
		}
	}
	return nil, fmt.Errorf("matrix: more than 2^32 distinct cells")
}

// htmlCells numbers the distinct cells (d.Texts, d.Pairs) in the order
// they appear and returns base64(gzip(cell numbers)); ok is false if a
// number does not fit in width bytes.
func htmlCells(g grid, d *htmlData, width int) (string, bool, error) {
	d.Texts, d.Pairs = nil, nil
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
	pairOf := func(f Flow) int {
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
		return pi
	}
	var z strings.Builder
	b64 := base64.NewEncoder(base64.StdEncoding, &z)
	zw, err := gzip.NewWriterLevel(b64, gzip.BestCompression)
	if err != nil {
		return "", false, err
	}
	n := len(g.labels())
	// known[k] is 1 + the pair number of the port's cells of key k.
	known := make([]int32, g.keys())
	raw := make([]byte, 0, n*width)
	limit := 1 << (8 * width)
	for pi := range g.portList() {
		clear(known)
		for i := range n {
			raw = raw[:0]
			for j := range n {
				k, unique := g.key(pi, i, j)
				c := int(known[k]) - 1
				if c < 0 || unique {
					c = pairOf(g.flow(pi, i, j))
					if !unique {
						known[k] = int32(c + 1)
					}
				}
				if c >= limit || (width == 4 && c >= 1<<31-1) {
					return "", false, nil
				}
				if width == 2 {
					raw = binary.LittleEndian.AppendUint16(raw, uint16(c))
				} else {
					raw = binary.LittleEndian.AppendUint32(raw, uint32(c))
				}
			}
			if _, err := zw.Write(raw); err != nil {
				return "", false, err
			}
		}
	}
	if err := zw.Close(); err != nil {
		return "", false, err
	}
	if err := b64.Close(); err != nil {
		return "", false, err
	}
	return z.String(), true, nil
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
