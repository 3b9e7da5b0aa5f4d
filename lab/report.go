package lab

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/moat-net/moat/matrix"
)

// Flow is one matrix cell as the lab measured it: the `moat matrix` JSON
// schema plus what was measured. Allowed is the measured verdict when
// Measured is true, otherwise the verdict of the programmed rules (or the
// prediction when no rule applies).
type Flow struct {
	matrix.Flow
	Measured bool `json:"measured"`
	// Predicted is the evaluator's verdict.
	Predicted bool `json:"predicted"`
	// Agree is false when the kernel and the evaluator disagree.
	Agree bool `json:"agree"`
	// Outcome is what the probe saw: reached, refused, dropped (the
	// kernel reported the drop of this flow's packet), dropped locally,
	// or timed out.
	Outcome string `json:"outcome,omitempty"`
	// Evidence names the node and chain whose rule dropped the flow.
	Evidence string `json:"evidence,omitempty"`
	// Reason says why a flow was not measured.
	Reason string `json:"reason,omitempty"`
	SrcIP  string `json:"srcIP,omitempty"`
	DstIP  string `json:"dstIP,omitempty"`
	// OtherFamily marks the flow of a dual-stack pair over its second
	// address family, labelled with its addresses: the matrix shows it
	// only when its verdict differs from its cell's (a mixed cell).
	OtherFamily bool `json:"otherFamily,omitempty"`
	primary     int
}

// Report is a measured matrix.
type Report struct {
	Lab       string             `json:"lab"`
	Endpoints []string           `json:"-"`
	Ports     []matrix.PortProto `json:"-"`
	Flows     []Flow             `json:"flows"`
	// Warnings are problems that did not affect the measurement, such
	// as a namespace that could not be removed afterwards.
	Warnings []string `json:"warnings,omitempty"`
}

// Disagreements lists the flows where the kernel and the evaluator differ.
func (r *Report) Disagreements() []Flow {
	var out []Flow
	for _, f := range r.Flows {
		if !f.Agree {
			out = append(out, f)
		}
	}
	return out
}

// Matrix converts the report for matrix.WriteTable and friends: cells
// carry the measured verdict.
func (r *Report) Matrix() *matrix.Result {
	m := &matrix.Result{Endpoints: r.Endpoints, Ports: r.Ports}
	at := make([]int, len(r.Flows))
	for i, f := range r.Flows {
		if f.OtherFamily {
			continue
		}
		at[i] = len(m.Flows)
		mf := f.Flow
		mf.OtherFamilies = nil // the evaluator's; the measured ones follow
		m.Flows = append(m.Flows, mf)
	}
	for _, f := range r.Flows {
		if f.OtherFamily && f.Allowed != r.Flows[f.primary].Allowed {
			mf := &m.Flows[at[f.primary]]
			mf.OtherFamilies = append(mf.OtherFamilies, f.Flow)
		}
	}
	return m
}

// Write prints the report to out as "table" (the measured matrix as
// `moat matrix` prints it) or "json" (the `moat matrix` schema plus what
// was measured per flow), and its summary to summary.
func (r *Report) Write(out, summary io.Writer, format string) error {
	var err error
	switch format {
	case "table":
		fmt.Fprintf(out, "lab %s: measured with real packets\n\n", r.Lab)
		err = matrix.WriteTable(out, r.Matrix())
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	default:
		return fmt.Errorf("report format %q: must be table or json", format)
	}
	if err != nil {
		return err
	}
	r.writeSummary(summary)
	return nil
}

// writeSummary prints how many flows were measured, why the others were
// not, the warnings, and every flow where the kernel and the evaluator
// disagree.
func (r *Report) writeSummary(w io.Writer) {
	measured, unmeasured := 0, 0
	reasons := map[string]int{}
	for _, f := range r.Flows {
		if f.Measured {
			measured++
		} else {
			unmeasured++
			reasons[f.Reason]++
		}
	}
	fmt.Fprintf(w, "%d flows measured with real packets, %d not measured\n", measured, unmeasured)
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %d not measured: %s\n", reasons[k], k)
	}
	for _, warn := range r.Warnings {
		fmt.Fprintln(w, "warning:", warn)
	}
	bad := r.Disagreements()
	if len(bad) == 0 {
		fmt.Fprintln(w, "every flow agrees with the evaluator")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DISAGREE\tFROM\tTO\tPORT\tKERNEL\tEVALUATOR\tEGRESS\tINGRESS")
	for _, f := range bad {
		kernel := verdictWord(f.Allowed)
		if f.Outcome != "" {
			kernel += " (" + f.Outcome + ")"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%d/%s\t%s\t%s\t%s\t%s\n", f.From, f.To, f.Port, f.Protocol, kernel, verdictWord(f.Predicted), f.Egress.Reason, f.Ingress.Reason)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "%d flows disagree with the evaluator\n", len(bad))
}

func verdictWord(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
}
