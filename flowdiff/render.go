package flowdiff

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/moat-net/moat/policy"
)

// WriteJSON prints the Result.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable prints one line per changed flow: the verdicts before and
// after, and beside each the explanation of the direction(s) that changed.
func WriteTable(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\n", Summary(r))
	if len(r.Changes) > 0 {
		fmt.Fprintln(tw, "FROM\tTO\tPORT\tBEFORE\tAFTER\tWHY BEFORE\tWHY AFTER")
	}
	for _, c := range r.Changes {
		b, a := Why(c)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.From, c.To, portOf(c), word(c.Before.Allowed), word(c.After.Allowed), b, a)
	}
	return tw.Flush()
}

// Summary is one line: how many flows change, of how many, and the pods
// only one state has.
func Summary(r *Result) string {
	s := fmt.Sprintf("%d of %d flows change verdict (%d judged)", r.ChangedFlows(), r.Flows, r.Judged)
	if len(r.AddedPods) > 0 {
		s += fmt.Sprintf("; pods added (flows not compared): %s", strings.Join(r.AddedPods, ", "))
	}
	if len(r.RemovedPods) > 0 {
		s += fmt.Sprintf("; pods removed (flows not compared): %s", strings.Join(r.RemovedPods, ", "))
	}
	return s
}

// Why explains a change on each side by the directions whose decision
// changed ("egress: ...; ingress: ...").
func Why(c Change) (before, after string) {
	type dir struct {
		name string
		b, a policy.Decision
	}
	dirs := []dir{{"egress", c.Before.Egress, c.After.Egress}, {"ingress", c.Before.Ingress, c.After.Ingress}}
	var bs, as []string
	for _, d := range dirs {
		if d.b.Allowed == d.a.Allowed && d.b.Reason == d.a.Reason {
			continue
		}
		bs = append(bs, d.name+": "+d.b.Reason)
		as = append(as, d.name+": "+d.a.Reason)
	}
	return strings.Join(bs, "; "), strings.Join(as, "; ")
}

// portOf is "port/protocol" (the protocol alone for ICMP), then what the
// port stands for ("22/TCP (any of 1-442)"), with the address family when
// the ends are dual-stack.
func portOf(c Change) string {
	s := fmt.Sprintf("%d/%s", c.Port, c.Protocol)
	if c.Port == 0 {
		s = c.Protocol
	}
	if c.Ports != "" {
		s += " (" + c.Ports + ")"
	}
	if c.Family != "" {
		s += " " + c.Family
	}
	return s
}

func word(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}

var page = template.Must(template.New("diff").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Moat diff</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
td.ok{background:#c8e6c9}td.no{background:#ffcdd2}
td.route{white-space:nowrap;font-family:ui-monospace,monospace}
</style></head><body>
<h1>Moat diff</h1>
<p>{{.Summary}}</p>
{{if .Rows}}<table>
<tr><th>from</th><th>to</th><th>port</th><th>before</th><th>after</th><th>why before</th><th>why after</th></tr>
{{range .Rows}}<tr><td class="route">{{.From}}</td><td class="route">{{.To}}</td><td class="route">{{.Port}}</td><td class="{{.BeforeClass}}">{{.Before}}</td><td class="{{.AfterClass}}">{{.After}}</td><td>{{.WhyBefore}}</td><td>{{.WhyAfter}}</td></tr>
{{end}}</table>{{end}}
</body></html>
`))

type htmlRow struct {
	From, To, Port          string
	Before, After           string
	BeforeClass, AfterClass string
	WhyBefore, WhyAfter     string
}

// WriteHTML prints one self-contained page with the changes side by side.
func WriteHTML(w io.Writer, r *Result) error {
	data := struct {
		Summary string
		Rows    []htmlRow
	}{Summary: Summary(r)}
	class := map[bool]string{true: "ok", false: "no"}
	for _, c := range r.Changes {
		b, a := Why(c)
		data.Rows = append(data.Rows, htmlRow{
			From: c.From, To: c.To, Port: portOf(c),
			Before: word(c.Before.Allowed), After: word(c.After.Allowed),
			BeforeClass: class[c.Before.Allowed], AfterClass: class[c.After.Allowed],
			WhyBefore: b, WhyAfter: a,
		})
	}
	return page.Execute(w, data)
}
