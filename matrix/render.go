package matrix

import (
	"encoding/json"
	"fmt"
	"html/template"
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

var page = template.Must(template.New("matrix").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Moat connectivity matrix</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:2em}
th,td{border:1px solid #ccc;padding:2px 6px;font-size:12px}
th.col{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}
td.ok{background:#7bc97b}td.no{background:#e57373}
td.ok,td.no{width:18px;text-align:center;cursor:help}
.legend span{display:inline-block;width:14px;height:14px;vertical-align:middle;margin:0 4px}
</style></head><body>
<h1>Moat connectivity matrix</h1>
<p class="legend"><span style="background:#7bc97b"></span>allowed <span style="background:#e57373"></span>denied. Rows are sources, columns destinations; hover a cell for the explanation.</p>
{{range .Blocks}}<h2>{{.Port}}</h2>
<table><tr><th>from \ to</th>{{range $.Endpoints}}<th class="col">{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><th>{{.From}}</th>{{range .Cells}}<td class="{{if .Allowed}}ok{{else}}no{{end}}" title="{{.Title}}">{{if .Allowed}}&#10003;{{else}}&#10007;{{end}}</td>{{end}}</tr>
{{end}}</table>
{{end}}</body></html>
`))

type htmlCell struct {
	Allowed bool
	Title   string
}

type htmlRow struct {
	From  string
	Cells []htmlCell
}

type htmlBlock struct {
	Port string
	Rows []htmlRow
}

// WriteHTML prints one self-contained page (no external resources): a
// colour grid per port with each cell's explanation on hover.
func WriteHTML(w io.Writer, r *Result) error {
	n := len(r.Endpoints)
	data := struct {
		Endpoints []string
		Blocks    []htmlBlock
	}{Endpoints: r.Endpoints}
	for pi, pp := range r.Ports {
		blk := htmlBlock{Port: pp.String()}
		for i, src := range r.Endpoints {
			row := htmlRow{From: src}
			for j := range n {
				f := r.Flows[pi*n*n+i*n+j]
				title := fmt.Sprintf("%s -> %s %s: %s\negress: %s\ningress: %s", f.From, f.To, pp, verdictWord(f.Allowed), f.Egress.Reason, f.Ingress.Reason)
				row.Cells = append(row.Cells, htmlCell{Allowed: f.Allowed, Title: title})
			}
			blk.Rows = append(blk.Rows, row)
		}
		data.Blocks = append(data.Blocks, blk)
	}
	return page.Execute(w, data)
}

func verdictWord(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}
