package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// cell is one matrix cell and how to measure it.
type cell struct {
	flow     matrix.Flow
	probe    *probeSpec
	reason   string
	pkt      nft.Packet
	src, dst place
	self     bool
	// other marks the flow of a dual-stack pair over its second family
	// (matrix.OtherFamilies), measured beside the cell's own: primary is
	// the index of that cell.
	other   bool
	primary int
}

// planCells lays out the matrix of prog (the same cells `moat matrix`
// prints) and the probe that measures each.
func planCells(t *topology, prog *policy.Program, peers []netip.Addr, ports []matrix.PortProto) ([]cell, []string, []matrix.PortProto, error) {
	if len(ports) == 0 {
		ports = matrix.DefaultPorts(prog)
	}
	if len(ports) == 0 {
		return nil, nil, nil, errors.New("no ports: the input declares no container ports, pass --port")
	}
	eps := matrix.Endpoints(prog, peers)
	labels := make([]string, len(eps))
	for i, e := range eps {
		labels[i] = e.Label
	}
	var cells []cell
	for _, pp := range ports {
		for _, s := range eps {
			for _, d := range eps {
				c := cell{flow: matrix.Judge(prog, s, d, pp)}
				se, de, ok := prog.PairAddrs(s.Endpoint, d.Endpoint)
				if !ok {
					c.reason = "source and destination share no IP family"
					cells = append(cells, c)
					continue
				}
				if err := t.plan(&c, se, de, pp); err != nil {
					return nil, nil, nil, err
				}
				primary := len(cells)
				cells = append(cells, c)
				// The pair's other family is a flow of its own, which
				// policies may judge differently (an ipBlock has one
				// family): measured too.
				for _, of := range matrix.OtherFamilies(prog, s, d, pp) {
					pair, _ := prog.PairAddrsIn(s.Endpoint, d.Endpoint, !se.Addr.Is4())
					oc := cell{flow: of, other: true, primary: primary}
					if err := t.plan(&oc, pair[0], pair[1], pp); err != nil {
						return nil, nil, nil, err
					}
					cells = append(cells, oc)
				}
			}
		}
	}
	return cells, labels, ports, nil
}

// plan fills in how a cell is measured: its first packet, where each end
// is in the lab, and its probe (or why it has none).
func (t *topology) plan(c *cell, se, de policy.Endpoint, pp matrix.PortProto) error {
	c.pkt = nft.Packet{Src: se.Addr, Dst: de.Addr, Proto: pp.Protocol, Port: pp.Port}
	c.self = se.Pod >= 0 && se.Pod == de.Pod || se.Pod < 0 && se.Addr == de.Addr
	var ok1, ok2 bool
	c.src, ok1 = t.Locate(se.Addr)
	c.dst, ok2 = t.Locate(de.Addr)
	if !ok1 || !ok2 {
		return fmt.Errorf("flow %s -> %s: address not in the lab", se.Addr, de.Addr)
	}
	switch pp.Protocol {
	case policy.ProtoTCP, policy.ProtoUDP:
		c.probe = &probeSpec{SrcNS: c.src.NS, Src: se.Addr, Dst: de.Addr, Proto: pp.Protocol, Port: pp.Port}
	default:
		c.reason = fmt.Sprintf("%s sockets are not available in this kernel: verdict read from the programmed rules", pp.Protocol)
	}
	return nil
}

func probeList(cells []cell) []probeSpec {
	var out []probeSpec
	for _, c := range cells {
		if c.probe != nil {
			out = append(out, *c.probe)
		}
	}
	return out
}

// measure probes every cell of prog's matrix and compares each with the
// evaluator. Flows whose probe timed out although the evaluator allows
// them are probed once more with a longer timeout, so a busy machine does
// not pass for a dropping rule; a probe that fails for another reason is
// a lab error.
func measure(ctx context.Context, t *topology, ns *namespaces, rulesets map[string]*nft.Ruleset, prog *policy.Program, peers []netip.Addr, ports []matrix.PortProto, opts ProbeOptions) (*Report, error) {
	opts = opts.withDefaults()
	cells, labels, ports, err := planCells(t, prog, peers, ports)
	if err != nil {
		return nil, err
	}
	if opts.Only != nil {
		// A pair's other family goes with its cell (its flow is
		// labelled with addresses, not endpoints).
		at := make([]int, len(cells))
		var kept []cell
		for i, c := range cells {
			pi := i
			if c.other {
				pi = c.primary
			}
			if opts.Only(cells[pi].flow) {
				at[i] = len(kept)
				if c.other {
					c.primary = at[c.primary]
				}
				kept = append(kept, c)
			}
		}
		cells = kept
	}
	var idx []int
	var probes []probeSpec
	for i, c := range cells {
		if c.probe != nil {
			idx = append(idx, i)
			probes = append(probes, *c.probe)
		}
	}
	pr := &prober{ns: ns}
	var warnings []string
	if !opts.noEvidence {
		tr, err := startTracer(ctx, t, ns)
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("no drop records from the kernel (%v): denied flows wait out the timeout", err))
		} else {
			pr.tr = tr
			defer tr.close()
		}
	}
	results := pr.all(ctx, probes, opts)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("measuring interrupted: %w", err)
	}
	// A timeout is weaker evidence than a reply or a drop record: a busy
	// machine can be slow. Flows the evaluator allows that timed out, and
	// with drop records every flow that timed out without one, are
	// probed once more with a longer timeout.
	var again []int
	for k, r := range results {
		retry := (r.Outcome == timedOut || r.Outcome == droppedLocally) && cells[idx[k]].flow.Allowed
		if r.Outcome == timedOut && pr.tr != nil {
			retry = true
		}
		if retry {
			again = append(again, k)
		}
	}
	if len(again) > 0 {
		retry := make([]probeSpec, len(again))
		for j, k := range again {
			retry[j] = probes[k]
		}
		slow := opts
		slow.Timeout = max(4*opts.Timeout, 2*time.Second)
		for j, r := range pr.all(ctx, retry, slow) {
			results[again[j]] = r
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("measuring interrupted: %w", err)
		}
	}
	if pr.tr != nil && pr.tr.overflows() > 0 {
		warnings = append(warnings, fmt.Sprintf("trace events were lost %d times (receive buffer full): some denied flows waited out the timeout", pr.tr.overflows()))
	}
	rep := &Report{Lab: t.Prefix, Endpoints: labels, Ports: ports, Warnings: warnings}
	byCell := map[int]probeResult{}
	for k, r := range results {
		byCell[idx[k]] = r
	}
	var errs []error
	for i, c := range cells {
		f := Flow{Flow: c.flow, Predicted: c.flow.Allowed, Reason: c.reason, OtherFamily: c.other, primary: c.primary}
		if c.pkt.Src.IsValid() {
			f.SrcIP, f.DstIP = c.pkt.Src.String(), c.pkt.Dst.String()
		}
		if r, ok := byCell[i]; ok {
			if r.Outcome == failed {
				errs = append(errs, fmt.Errorf("probe %s (%s -> %s): %w", r.Probe, c.flow.From, c.flow.To, r.Err))
				f.Reason = "probe failed: " + r.Err.Error()
			} else {
				f.Measured = true
				f.Outcome = r.Outcome.String()
				f.Evidence = r.Evidence
				f.Allowed = r.Outcome.Reached()
			}
		} else if c.pkt.Src.IsValid() {
			f.Allowed = nft.PathAllows(c.pkt, t.crossed(rulesets, c)...)
		}
		f.Agree = f.Allowed == f.Predicted
		rep.Flows = append(rep.Flows, f)
	}
	return rep, errors.Join(errs...)
}

// crossed lists the rulesets a cell's packets go through.
func (t *topology) crossed(rulesets map[string]*nft.Ruleset, c cell) []*nft.Ruleset {
	if c.self {
		return nil
	}
	var out []*nft.Ruleset
	if c.src.Node >= 0 {
		out = append(out, rulesets[t.Nodes[c.src.Node].Name])
	}
	if c.dst.Node >= 0 && c.dst.Node != c.src.Node {
		out = append(out, rulesets[t.Nodes[c.dst.Node].Name])
	}
	return out
}

// Measure probes every flow of the matrix of the Program the lab is
// programmed with and compares each with the evaluator. SCTP flows are
// judged from the rules Apply programmed.
func (l *Lab) Measure(ctx context.Context, opts ProbeOptions) (*Report, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	rep, err := measure(ctx, l.st.Topology, l.ns, l.rulesets(), l.prog, l.st.Peers, l.st.Ports, opts)
	if rep != nil {
		rep.Warnings = append(rep.Warnings, l.warnings...)
	}
	return rep, err
}
