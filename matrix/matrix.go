// Package matrix computes and renders connectivity matrices: every source
// against every destination, per port, with the evaluator's explanation of
// each cell. `moat matrix` prints it; `moat lab` measures the same flows.
package matrix

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/moat-net/moat/policy"
)

// PortProto is one port and protocol of the matrix, e.g. 80/TCP.
type PortProto struct {
	Port     uint16
	Protocol policy.Protocol
}

// String is "80/TCP".
func (p PortProto) String() string { return fmt.Sprintf("%d/%s", p.Port, p.Protocol) }

// ParsePortProto parses "80", "80/TCP" or "53/udp".
func ParsePortProto(s string) (PortProto, error) {
	num, proto, found := strings.Cut(s, "/")
	pp := PortProto{Protocol: policy.ProtoTCP}
	if found {
		p, err := policy.ParseProtocol(proto)
		if err != nil || !p.HasPorts() {
			return pp, fmt.Errorf("port %q: protocol must be TCP, UDP or SCTP", s)
		}
		pp.Protocol = p
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > 65535 {
		return pp, fmt.Errorf("port %q: must be a number between 1 and 65535", s)
	}
	pp.Port = uint16(n)
	return pp, nil
}

// Options choose the matrix's axes.
type Options struct {
	// Ports to judge; empty means every distinct container port of the
	// snapshot.
	Ports []PortProto
	// Peers are extra endpoints outside the pod network (external
	// addresses, node IPs).
	Peers []netip.Addr
	// Namespaces, when set, keep only the pods of these namespaces (peers
	// stay).
	Namespaces []string
}

// ParseOptions reads the values of the --port and --peer flags, naming the
// flag in errors. Every reader of those flags (moat matrix, moat lab, an
// example's matrix.args) goes through it.
func ParseOptions(ports, peers []string) (Options, error) {
	var opts Options
	for _, p := range ports {
		pp, err := ParsePortProto(p)
		if err != nil {
			return opts, fmt.Errorf("--port: %w", err)
		}
		opts.Ports = append(opts.Ports, pp)
	}
	for _, p := range peers {
		a, err := netip.ParseAddr(p)
		if err != nil || a.Zone() != "" {
			return opts, fmt.Errorf("--peer %q: not an IP address", p)
		}
		opts.Peers = append(opts.Peers, a.Unmap())
	}
	return opts, nil
}

// Flow is one cell: the JSON schema of `moat matrix -o json`.
type Flow struct {
	From     string          `json:"from"`
	To       string          `json:"to"`
	Port     uint16          `json:"port"`
	Protocol string          `json:"protocol"`
	Allowed  bool            `json:"allowed"`
	Egress   policy.Decision `json:"egress"`
	Ingress  policy.Decision `json:"ingress"`
	// OtherFamilies are the same pair's flows over the other address
	// family of a dual-stack pair, labelled with their addresses: in a
	// matrix (Build) only when that family's verdict differs from this
	// one's (the cell is mixed: a reader of Allowed alone would miss an
	// open or a closed path); in moat explain always.
	OtherFamilies []Flow `json:"otherFamilies,omitempty"`
}

// Mixed reports whether the flow's verdict differs by address family.
func (f *Flow) Mixed() bool { return len(f.OtherFamilies) > 0 }

// Result is the whole matrix.
type Result struct {
	// Endpoints are the row and column labels, in order.
	Endpoints []string    `json:"-"`
	Ports     []PortProto `json:"-"`
	Flows     []Flow      `json:"flows"`
}

// Endpoint is a matrix row/column: a label and the endpoint it stands for.
type Endpoint struct {
	Label    string
	Endpoint policy.Endpoint
}

// Endpoints lists the matrix's rows and columns: every pod with an address
// (host-network pods included), then each peer.
func Endpoints(p *policy.Program, peers []netip.Addr) []Endpoint {
	var out []Endpoint
	for i := range p.Pods {
		pod := &p.Pods[i]
		if len(pod.IPs) == 0 {
			continue
		}
		out = append(out, Endpoint{Label: pod.Key(), Endpoint: policy.Endpoint{Pod: i, Addr: pod.IPs[0]}})
	}
	for _, a := range peers {
		out = append(out, Endpoint{Label: a.String(), Endpoint: policy.Endpoint{Pod: -1, Addr: a.Unmap()}})
	}
	return out
}

// DefaultPorts is every distinct container port of the snapshot.
func DefaultPorts(p *policy.Program) []PortProto {
	seen := map[PortProto]bool{}
	var out []PortProto
	for _, pod := range p.Pods {
		for _, cp := range pod.Ports {
			pp := PortProto{cp.Port, cp.Protocol}
			if !seen[pp] {
				seen[pp] = true
				out = append(out, pp)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].Protocol < out[j].Protocol
	})
	return out
}

// axes are a matrix's ports and endpoints: opts' or the Program's.
func axes(p *policy.Program, opts Options) ([]PortProto, []Endpoint, error) {
	ports := opts.Ports
	if len(ports) == 0 {
		ports = DefaultPorts(p)
	}
	if len(ports) == 0 {
		return nil, nil, fmt.Errorf("no ports: the input declares no container ports, pass --port")
	}
	eps, err := filterNamespaces(p, Endpoints(p, opts.Peers), opts.Namespaces)
	if err != nil {
		return nil, nil, err
	}
	return ports, eps, nil
}

// Build evaluates every ordered pair of endpoints (self included) on every
// port, and a dual-stack pair over both families.
func Build(p *policy.Program, opts Options) (*Result, error) {
	ports, eps, err := axes(p, opts)
	if err != nil {
		return nil, err
	}
	res := &Result{Ports: ports}
	for _, e := range eps {
		res.Endpoints = append(res.Endpoints, e.Label)
	}
	for _, pp := range ports {
		for _, src := range eps {
			for _, dst := range eps {
				f := Judge(p, src, dst, pp)
				for _, o := range OtherFamilies(p, src, dst, pp) {
					if o.Allowed != f.Allowed {
						f.OtherFamilies = append(f.OtherFamilies, o)
					}
				}
				res.Flows = append(res.Flows, f)
			}
		}
	}
	return res, nil
}

// filterNamespaces keeps the peers and the pods of namespaces; every
// namespace must have a pod, so that a misspelt one is not an empty matrix.
func filterNamespaces(p *policy.Program, eps []Endpoint, namespaces []string) ([]Endpoint, error) {
	if len(namespaces) == 0 {
		return eps, nil
	}
	want := map[string]bool{}
	for _, ns := range namespaces {
		want[ns] = false
	}
	var out []Endpoint
	for _, e := range eps {
		if e.Endpoint.Pod < 0 {
			out = append(out, e)
			continue
		}
		ns := p.Pods[e.Endpoint.Pod].Namespace
		if _, ok := want[ns]; ok {
			want[ns] = true
			out = append(out, e)
		}
	}
	for _, ns := range namespaces {
		if !want[ns] {
			return nil, fmt.Errorf("namespace %q: no pod with an address in the input", ns)
		}
	}
	return out, nil
}

// Judge evaluates one cell.
func Judge(p *policy.Program, src, dst Endpoint, pp PortProto) Flow {
	f := Flow{From: src.Label, To: dst.Label, Port: pp.Port, Protocol: pp.Protocol.String()}
	s, d, ok := p.PairAddrs(src.Endpoint, dst.Endpoint)
	if !ok {
		no := policy.Decision{Allowed: false, Tier: policy.TierNotPoliced, Reason: "source and destination share no IP family"}
		f.Egress, f.Ingress = no, no
		return f
	}
	v := p.Evaluate(policy.Flow{Src: s, Dst: d, Proto: pp.Protocol, Port: pp.Port})
	f.Allowed, f.Egress, f.Ingress = v.Allowed, v.Egress, v.Ingress
	return f
}

// OtherFamilies judges the same pair over each other address family both
// endpoints have (dual stack): a matrix cell uses one family, and policies
// can treat the families differently. The flows are labelled with their
// addresses.
func OtherFamilies(p *policy.Program, src, dst Endpoint, pp PortProto) []Flow {
	first, _, ok := p.PairAddrs(src.Endpoint, dst.Endpoint)
	if !ok {
		return nil
	}
	pair, ok := p.PairAddrsIn(src.Endpoint, dst.Endpoint, !first.Addr.Is4())
	if !ok {
		return nil
	}
	s, d := src, dst
	s.Endpoint, d.Endpoint = pair[0], pair[1]
	s.Endpoint.Fixed, d.Endpoint.Fixed = true, true
	s.Label, d.Label = pair[0].Addr.String(), pair[1].Addr.String()
	return []Flow{Judge(p, s, d, pp)}
}
