package matrix

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteJSON prints {"flows":[...]}.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable prints one compact block per port: rows are sources, columns
// destinations (numbered), "." allowed, "X" denied, "~" allowed over one
// address family of a dual-stack pair only (the JSON has both).
func WriteTable(w io.Writer, r *Result) error {
	n := len(r.Endpoints)
	width := 0
	for _, e := range r.Endpoints {
		width = max(width, len(e))
	}
	numW := len(fmt.Sprint(n))
	var b strings.Builder
	for pi, pp := range r.Ports {
		if pi > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "%s   (rows: from, columns: to; . allowed, X denied%s)\n", pp, mixedLegend(r, pi))
		fmt.Fprintf(&b, "%*s", numW+2+width, "")
		for j := range n {
			fmt.Fprintf(&b, " %*d", numW, j+1)
		}
		b.WriteString("\n")
		for i, src := range r.Endpoints {
			fmt.Fprintf(&b, "%*d %-*s ", numW, i+1, width, src)
			for j := range n {
				f := r.Flows[pi*n*n+i*n+j]
				mark := "X"
				switch {
				case f.Mixed():
					mark = "~"
				case f.Allowed:
					mark = "."
				}
				fmt.Fprintf(&b, " %*s", numW, mark)
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// mixedLegend explains "~" in the legend of a port's block that has one.
func mixedLegend(r *Result, pi int) string {
	n := len(r.Endpoints)
	for _, f := range r.Flows[pi*n*n : (pi+1)*n*n] {
		if f.Mixed() {
			return ", ~ allowed over one address family only (see -o json)"
		}
	}
	return ""
}
