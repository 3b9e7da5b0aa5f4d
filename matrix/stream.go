package matrix

import (
	"fmt"

	"github.com/moat-net/moat/policy"
)

// A Matrix is judged as it is printed: no cell is kept. Build holds every
// Flow with both explanations (about 1.7 KB each): 1,000 pods on 5 ports
// took 6.2 GB before the first line was printed. A Matrix holds the
// endpoints, their classes (classes.go) and, for the port being printed,
// one byte per pair of classes; explanations are built only for the
// formats that print them (json, html), once per pair of classes.

// mark is a cell's verdict without its explanation.
type mark uint8

const (
	markAllowed mark = 1 << iota
	// markMixed: the pair's other address family gets the other verdict.
	markMixed
)

// grid is what the writers read: a matrix's axes and, on demand, its
// cells. Result (every flow in memory) and Matrix (judged on demand) are
// both grids, so each format has one writer.
type grid interface {
	labels() []string
	portList() []PortProto
	// rowMarks fills out (one per endpoint) with the marks of row i of
	// port pi.
	rowMarks(pi, i int, out []mark)
	// hasMixed reports whether port pi has a mixed cell.
	hasMixed(pi int) bool
	// flow is one cell with its explanations.
	flow(pi, i, j int) Flow
	// key numbers the cells of port pi that have the same verdict and
	// explanations (labels aside) alike, below keys(); unique is set for
	// a cell whose explanation names its own addresses (a mixed cell).
	key(pi, i, j int) (k int, unique bool)
	keys() int
}

// Matrix is a connectivity matrix judged cell by cell as a writer asks:
// memory grows with the endpoints and the square of their classes, not
// with the cells printed. Its writers keep caches in it: one writer at a
// time.
type Matrix struct {
	prog  *policy.Program
	eps   []Endpoint
	lbls  []string
	ports []PortProto
	cls   *classes
	// marks are the class pairs' marks of port markPort (-1: none yet):
	// K*K off the diagonal (from class a to class b at a*K+b, judged
	// between two different endpoints), then K for the diagonal (an
	// endpoint to itself).
	marks    []mark
	markPort int
	// rows caches the explained rows of a few source classes of port
	// rowPort: rows of one class are usually printed together.
	rows    map[int32][]Flow
	rowFIFO []int32
	rowPort int
}

// rowCache is how many explained class rows a Matrix keeps.
const rowCache = 16

// New prepares the matrix of a Program: its endpoints, ports and classes.
// Nothing is judged until a writer prints it.
func New(p *policy.Program, opts Options) (*Matrix, error) {
	ports, eps, err := axes(p, opts)
	if err != nil {
		return nil, err
	}
	cls, err := newClasses(p, eps)
	if err != nil {
		return nil, err
	}
	m := &Matrix{prog: p, eps: eps, ports: ports, cls: cls, markPort: -1, rowPort: -1}
	for _, e := range eps {
		m.lbls = append(m.lbls, e.Label)
	}
	return m, nil
}

// Endpoints is the number of rows (and columns) of each port's block.
func (m *Matrix) Endpoints() int { return len(m.eps) }

// Ports are the matrix's ports.
func (m *Matrix) Ports() []PortProto { return m.ports }

// TableSize is the size in bytes of what WriteTable prints, without
// judging anything: the cost of a matrix, told before it is paid.
func (m *Matrix) TableSize() int64 {
	n := int64(len(m.eps))
	width := 0
	for _, l := range m.lbls {
		width = max(width, len(l))
	}
	numW := int64(len(fmt.Sprint(n)))
	perPort := int64(80) + (numW+2+int64(width)+n*(numW+1)+1)*(n+1)
	return perPort * int64(len(m.ports))
}

// Classes is the number of classes of endpoints judged alike.
func (m *Matrix) Classes() int { return len(m.cls.reps) }

func (m *Matrix) labels() []string      { return m.lbls }
func (m *Matrix) portList() []PortProto { return m.ports }

// pairOf is the endpoints that stand for the cell (i, j): the classes'
// first endpoints, or for two endpoints of one class its first two; ok is
// false for the diagonal pair of a class of one (no such cell but i == j).
func (m *Matrix) pairOf(ci, cj int32, diagonal bool) (src, dst int, ok bool) {
	r, s := m.cls.reps[ci], m.cls.reps[cj]
	if diagonal {
		return r[0], r[0], true
	}
	if ci != cj {
		return r[0], s[0], true
	}
	return r[0], r[1], r[1] >= 0
}

// portMarks judges every pair of classes of port pi, verdicts only.
func (m *Matrix) portMarks(pi int) []mark {
	if m.markPort == pi {
		return m.marks
	}
	k := len(m.cls.reps)
	if cap(m.marks) < k*k+k {
		m.marks = make([]mark, k*k+k)
	}
	m.marks = m.marks[:k*k+k]
	pp := m.ports[pi]
	for a := range k {
		for b := range k {
			if s, d, ok := m.pairOf(int32(a), int32(b), false); ok {
				m.marks[a*k+b] = judgeMark(m.prog, m.eps[s], m.eps[d], pp)
			}
		}
		s := m.cls.reps[a][0]
		m.marks[k*k+a] = judgeMark(m.prog, m.eps[s], m.eps[s], pp)
	}
	m.markPort = pi
	return m.marks
}

// judgeMark is Judge and OtherFamilies without explanations: the
// evaluator's Program.Allowed, which does not allocate.
func judgeMark(p *policy.Program, src, dst Endpoint, pp PortProto) mark {
	s, d, ok := p.PairAddrs(src.Endpoint, dst.Endpoint)
	if !ok {
		return 0
	}
	var mk mark
	allowed := p.Allowed(policy.Flow{Src: s, Dst: d, Proto: pp.Protocol, Port: pp.Port})
	if allowed {
		mk = markAllowed
	}
	if pair, ok := p.PairAddrsIn(src.Endpoint, dst.Endpoint, !s.Addr.Is4()); ok {
		pair[0].Fixed, pair[1].Fixed = true, true
		if p.Allowed(policy.Flow{Src: pair[0], Dst: pair[1], Proto: pp.Protocol, Port: pp.Port}) != allowed {
			mk |= markMixed
		}
	}
	return mk
}

func (m *Matrix) rowMarks(pi, i int, out []mark) {
	marks := m.portMarks(pi)
	k := len(m.cls.reps)
	row := marks[int(m.cls.of[i])*k : int(m.cls.of[i])*k+k]
	for j, c := range m.cls.of {
		out[j] = row[c]
	}
	out[i] = marks[k*k+int(m.cls.of[i])]
}

func (m *Matrix) hasMixed(pi int) bool {
	marks := m.portMarks(pi)
	k := len(m.cls.reps)
	for a := range k {
		for b := range k {
			if _, _, ok := m.pairOf(int32(a), int32(b), false); ok && marks[a*k+b]&markMixed != 0 {
				return true
			}
		}
		if marks[k*k+a]&markMixed != 0 {
			return true
		}
	}
	return false
}

func (m *Matrix) keys() int {
	k := len(m.cls.reps)
	return k*k + k
}

func (m *Matrix) key(pi, i, j int) (int, bool) {
	k := len(m.cls.reps)
	ci, cj := int(m.cls.of[i]), int(m.cls.of[j])
	n := ci*k + cj
	if i == j {
		n = k*k + ci
	}
	return n, m.portMarks(pi)[n]&markMixed != 0
}

// flow judges a cell with its explanations: its class pair's, from a
// cache of explained rows, relabelled; a mixed cell's other family is
// judged on the cell's own addresses.
func (m *Matrix) flow(pi, i, j int) Flow {
	ci := m.cls.of[i]
	row := m.explainedRow(pi, ci)
	k := len(m.cls.reps)
	var f Flow
	if i == j {
		f = row[k]
	} else {
		f = row[m.cls.of[j]]
	}
	f.From, f.To = m.lbls[i], m.lbls[j]
	if f.OtherFamilies != nil {
		f.OtherFamilies = nil
		for _, o := range OtherFamilies(m.prog, m.eps[i], m.eps[j], m.ports[pi]) {
			if o.Allowed != f.Allowed {
				f.OtherFamilies = append(f.OtherFamilies, o)
			}
		}
	}
	return f
}

// explainedRow is class ci's row of port pi: one Flow per destination
// class, then the diagonal's.
func (m *Matrix) explainedRow(pi int, ci int32) []Flow {
	if m.rowPort != pi {
		m.rows, m.rowFIFO, m.rowPort = map[int32][]Flow{}, nil, pi
	}
	if row, ok := m.rows[ci]; ok {
		return row
	}
	k := len(m.cls.reps)
	row := make([]Flow, k+1)
	pp := m.ports[pi]
	judge := func(s, d int) Flow {
		f := Judge(m.prog, m.eps[s], m.eps[d], pp)
		for _, o := range OtherFamilies(m.prog, m.eps[s], m.eps[d], pp) {
			if o.Allowed != f.Allowed {
				f.OtherFamilies = append(f.OtherFamilies, o)
			}
		}
		return f
	}
	for cj := range k {
		if s, d, ok := m.pairOf(ci, int32(cj), false); ok {
			row[cj] = judge(s, d)
		}
	}
	s := m.cls.reps[ci][0]
	row[k] = judge(s, s)
	if len(m.rowFIFO) == rowCache {
		delete(m.rows, m.rowFIFO[0])
		m.rowFIFO = m.rowFIFO[1:]
	}
	m.rows[ci] = row
	m.rowFIFO = append(m.rowFIFO, ci)
	return row
}

// resultGrid reads a Result's flows: moat lab's measured matrix.
type resultGrid struct{ r *Result }

func (g resultGrid) labels() []string      { return g.r.Endpoints }
func (g resultGrid) portList() []PortProto { return g.r.Ports }
func (g resultGrid) at(pi, i, j int) *Flow {
	n := len(g.r.Endpoints)
	return &g.r.Flows[(pi*n+i)*n+j]
}

func (g resultGrid) rowMarks(pi, i int, out []mark) {
	for j := range out {
		out[j] = flowMark(g.at(pi, i, j))
	}
}

func flowMark(f *Flow) mark {
	var mk mark
	if f.Allowed {
		mk = markAllowed
	}
	if f.Mixed() {
		mk |= markMixed
	}
	return mk
}

func (g resultGrid) hasMixed(pi int) bool {
	n := len(g.r.Endpoints)
	for _, f := range g.r.Flows[pi*n*n : (pi+1)*n*n] {
		if f.Mixed() {
			return true
		}
	}
	return false
}

func (g resultGrid) flow(pi, i, j int) Flow { return *g.at(pi, i, j) }
func (g resultGrid) keys() int {
	n := len(g.r.Endpoints)
	return n * n
}
func (g resultGrid) key(pi, i, j int) (int, bool) {
	return i*len(g.r.Endpoints) + j, g.at(pi, i, j).Mixed()
}
