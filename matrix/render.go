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
// destinations (numbered), "." allowed and "X" denied.
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
		fmt.Fprintf(&b, "%s   (rows: from, columns: to; . allowed, X denied)\n", pp)
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
				if f.Allowed {
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
