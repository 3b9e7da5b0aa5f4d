package matrix

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteJSON prints {"flows":[...]}.
func WriteJSON(w io.Writer, r *Result) error { return writeJSON(w, resultGrid{r}) }

// WriteJSON prints {"flows":[...]}, one flow at a time.
func (m *Matrix) WriteJSON(w io.Writer) error { return writeJSON(w, m) }

// writeJSON prints what json.Encoder with a two-space indent prints for
// a Result, flow by flow, so that no more than one flow is in memory.
func writeJSON(w io.Writer, g grid) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	n := len(g.labels())
	if n == 0 || len(g.portList()) == 0 {
		// A Result without flows encodes its nil slice as null.
		_, err := io.WriteString(bw, "{\n  \"flows\": null\n}\n")
		if err != nil {
			return err
		}
		return bw.Flush()
	}
	// Cells of one key differ only in their labels, the first two fields:
	// the rest is encoded once per key (a bounded cache) and each cell
	// writes its two labels, encoded once each, before it.
	lbls := make([][]byte, n)
	for i, l := range g.labels() {
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		lbls[i] = b
	}
	const head = "{\n      \"from\": \"\",\n      \"to\": \"\""
	rests := map[int][]byte{}
	bw.WriteString("{\n  \"flows\": [\n")
	first := true
	for pi := range g.portList() {
		clear(rests)
		for i := range n {
			for j := range n {
				k, unique := g.key(pi, i, j)
				rest, ok := rests[k]
				if !ok || unique {
					f := g.flow(pi, i, j)
					f.From, f.To = "", ""
					b, err := json.MarshalIndent(f, "    ", "  ")
					if err != nil {
						return err
					}
					if !bytes.HasPrefix(b, []byte(head)) {
						return fmt.Errorf("matrix: unexpected JSON encoding of a flow: %.40q", b)
					}
					rest = b[len(head):]
					if !unique {
						if len(rests) >= jsonCache {
							clear(rests)
						}
						rests[k] = rest
					}
				}
				if !first {
					bw.WriteString(",\n")
				}
				first = false
				bw.WriteString("    {\n      \"from\": ")
				bw.Write(lbls[i])
				bw.WriteString(",\n      \"to\": ")
				bw.Write(lbls[j])
				if _, err := bw.Write(rest); err != nil {
					return err
				}
			}
		}
	}
	bw.WriteString("\n  ]\n}\n")
	return bw.Flush()
}

// jsonCache bounds the encoded cells writeJSON keeps per port.
const jsonCache = 4096

// WriteTable prints one compact block per port: rows are sources, columns
// destinations (numbered), "." allowed, "X" denied, "~" allowed over one
// address family of a dual-stack pair only (the JSON has both).
func WriteTable(w io.Writer, r *Result) error { return writeTable(w, resultGrid{r}) }

// WriteTable prints the table of WriteTable row by row as it is judged.
func (m *Matrix) WriteTable(w io.Writer) error { return writeTable(w, m) }

func writeTable(w io.Writer, g grid) error {
	eps := g.labels()
	n := len(eps)
	width := 0
	for _, e := range eps {
		width = max(width, len(e))
	}
	numW := len(fmt.Sprint(n))
	// Each cell is " %*s" of its mark: numW spaces, then the mark in
	// place of the last.
	cell := func(c byte) []byte {
		b := []byte(strings.Repeat(" ", numW+1))
		b[numW] = c
		return b
	}
	denied, allowed, mixed := cell('X'), cell('.'), cell('~')
	bw := bufio.NewWriterSize(w, 64<<10)
	marks := make([]mark, n)
	var line []byte
	for pi, pp := range g.portList() {
		if pi > 0 {
			bw.WriteString("\n")
		}
		legend := ""
		if g.hasMixed(pi) {
			legend = ", ~ allowed over one address family only (see -o json)"
		}
		fmt.Fprintf(bw, "%s   (rows: from, columns: to; . allowed, X denied%s)\n", pp, legend)
		fmt.Fprintf(bw, "%*s", numW+2+width, "")
		for j := range n {
			fmt.Fprintf(bw, " %*d", numW, j+1)
		}
		bw.WriteString("\n")
		for i, src := range eps {
			line = fmt.Appendf(line[:0], "%*d %-*s ", numW, i+1, width, src)
			g.rowMarks(pi, i, marks)
			for _, mk := range marks {
				switch {
				case mk&markMixed != 0:
					line = append(line, mixed...)
				case mk&markAllowed != 0:
					line = append(line, allowed...)
				default:
					line = append(line, denied...)
				}
			}
			line = append(line, '\n')
			if _, err := bw.Write(line); err != nil {
				return err
			}
		}
	}
	return bw.Flush()
}
