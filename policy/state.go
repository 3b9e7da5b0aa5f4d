package policy

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/RoaringBitmap/roaring/v2"
)

// nsNameLabel is the label the API server puts on every namespace; selectors
// rely on it, so the compiler adds it even for namespaces it only knows by
// name.
const nsNameLabel = "kubernetes.io/metadata.name"

// state is everything a Compiler knows between compilations: the objects,
// the indexes over them, the selectors and peers resolved so far, the
// classes of pods each tier cannot tell apart, and the parts of Programs
// built from them. Programs share its immutable parts (address sets,
// matches, DirPolicies); state itself is changed in place, and every change
// records what it made dirty so that publish redoes only that.
type state struct {
	opts Options

	namespaces map[string]*nsState
	nsByID     []*nsState
	nsFree     []uint32
	nsIndex    *labelIndex

	slots     []*podState
	slotFree  []uint32
	order     []*podState // sorted by key: the Program's pod order
	podIndex  *labelIndex // pod-network pods by slot
	ipOwners  addrOwners
	addrIndex []slotAddr // pod-network addresses sorted, built on demand
	// addrs4 and addrs6 are each pod-network pod's address by slot;
	// addrsOdd the pods with several of a family (see setSlotAddrs).
	addrs4   []uint32
	addrs6   []u128
	addrsOdd *roaring.Bitmap

	nodes map[string]*Node
	// nodeAddrRefs counts the nodes that list each address: a pod's
	// change of address refreshes the nodes peers only when it touches
	// one (nodeClaimsChanged).
	nodeAddrRefs map[netip.Addr]int32

	nps      []*npState // input order; nil where deleted
	cnps     []*cnpState
	cnpNext  uint32
	cnpsByID map[uint32]*cnpState

	podSels map[string]*podSel
	nsSels  map[string]*nsSel
	peers   map[string]*peer
	sets    map[string]*peerSet
	// wideNamed are egress rules with named ports whose destinations
	// include pods matched by address (see peerSet.cidrs): any pod's change
	// of address or ports may change their match.
	wideNamed map[*rule]struct{}

	admin, baseline *cnpTier

	projIDs  map[string]int32
	projs    []map[string]string
	projBuf  []byte
	keyIDs   map[string]int32
	keyLists [][]string
	sigBuf   []ContainerPort
	sigIDs   map[string]int32
	sigs     []*namedSig
	namesIDs map[string]int32
	names    [][]string
	sigMemo  map[[2]int32]int32

	combos map[comboKey]*combo

	selCache selectorCache
	// onlyPods are Options.Pods as a set; nil when not set.
	onlyPods map[string]struct{}
	npSeq    int
	// loadKeys are the keys of a full compile's pods by their index
	// (podState.index), until its first Program is made.
	loadKeys []string
	// pendingFree are slots of pods deleted since the last publication.
	pendingFree []uint32
	// podsWithDiags are the pods without an address or with one that
	// another pod claims too.
	podsWithDiags map[*podState]struct{}
	// declared are the pod-network pods declaring each named port.
	declared map[namedKey]*roaring.Bitmap

	globalDiags []Diagnostic
	dirty       dirtySet
	prog        *Program
}

// dirtySet is what changes since the last publication touched.
type dirtySet struct {
	reclass   map[*podState]struct{}
	peers     map[*peer]struct{}
	rules     map[*rule]struct{}
	combos    map[*combo]struct{}
	relistNS  map[*npTier]struct{}
	relistCNP [2]bool // admin, baseline
	addrs     map[netip.Addr]struct{}
	// removed are the pods deleted (the Program's order changes).
	removed []*podState
	// pods need their Program entry updated; podData their Pod.
	pods    []*podState
	podData map[*podState]struct{}
	nodes   bool
	status  bool
	diags   bool
	full    bool
	// Named-port warnings to redo: policies, pods that changed, and
	// whether some name became declared or undeclared.
	namedPolicies map[any]struct{}
	namedPods     []namedChange
	namesFlipped  bool
}

func (d *dirtySet) reset() {
	*d = dirtySet{
		reclass: map[*podState]struct{}{}, peers: map[*peer]struct{}{}, rules: map[*rule]struct{}{},
		combos: map[*combo]struct{}{}, relistNS: map[*npTier]struct{}{},
		addrs: map[netip.Addr]struct{}{}, podData: map[*podState]struct{}{},
		namedPolicies: map[any]struct{}{},
	}
}

// nsState is one namespace, from a Namespace object or implied by a pod.
type nsState struct {
	id       uint32
	name     string
	labels   map[string]string // with the name label
	explicit bool              // a Namespace object exists
	refs     int               // pods, peers and NetworkPolicies naming it
	nonHost  int               // pods not on the host network
	pods     *roaring.Bitmap   // its pod-network pods by slot
	peers    map[*peer]struct{}
	tier     *npTier
	// proj caches the projection of labels for the Admin and Baseline
	// tiers, valid while projVer matches the tier's keysVer.
	proj    [2]int32
	projVer [2]int
}

// podState is one pod. Its fields are ordered to pack (a compiler holds
// one per pod of the cluster, pods elsewhere included).
type podState struct {
	// pod is the pod as given (Compiler.UpsertPod, Cluster.Pods), shared
	// with the caller and never changed: the agent's pod cache and its
	// compiler hold one copy.
	pod      *Pod
	ns       *nsState
	admin    *cnpClass
	baseline *cnpClass
	np       *npClass
	combo    *combo
	// projs caches the pod's label projections by key list (see projOf).
	projs   [2]podProj
	slot    uint32
	fullSig int32
	// index is the pod's position among the snapshot's pods, at a full
	// compile (the Program finds pods by slot: Program.slotIndex).
	index int32
	// podnet: a pod-network pod with an address, so a peer and a subject.
	podnet bool
	// subject: it gets a PodPolicy (podnet, and on Options.Node if set).
	subject bool
	gone    bool // deleted
	// listed: the pod is in the last Program's Pods (see listable).
	listed bool
}

type slotAddr struct {
	a    netip.Addr
	slot uint32
}

func newState(opts Options) *state {
	s := &state{
		opts:          opts,
		namespaces:    map[string]*nsState{},
		ipOwners:      newAddrOwners(0),
		nodes:         map[string]*Node{},
		nodeAddrRefs:  map[netip.Addr]int32{},
		cnpsByID:      map[uint32]*cnpState{},
		podSels:       map[string]*podSel{},
		nsSels:        map[string]*nsSel{},
		peers:         map[string]*peer{},
		sets:          map[string]*peerSet{},
		wideNamed:     map[*rule]struct{}{},
		projIDs:       map[string]int32{"": 0},
		projs:         []map[string]string{{}},
		sigIDs:        map[string]int32{"": 0},
		sigs:          []*namedSig{{id: 0}},
		namesIDs:      map[string]int32{"": 0},
		names:         [][]string{nil},
		sigMemo:       map[[2]int32]int32{},
		combos:        map[comboKey]*combo{},
		selCache:      selectorCache{},
		podsWithDiags: map[*podState]struct{}{},
		declared:      map[namedKey]*roaring.Bitmap{},
		addrsOdd:      roaring.New(),
		keyIDs:        map[string]int32{"": 0},
		keyLists:      [][]string{nil},
	}
	if len(opts.Pods) > 0 {
		s.onlyPods = map[string]struct{}{}
		for _, k := range opts.Pods {
			s.onlyPods[k] = struct{}{}
		}
	}
	s.nsIndex = newLabelIndex(func(id uint32) map[string]string { return s.nsByID[id].labels })
	s.podIndex = newLabelIndex(func(slot uint32) map[string]string { return s.slots[slot].pod.Labels })
	s.admin = newCNPTier(TierAdmin)
	s.baseline = newCNPTier(TierBaseline)
	s.dirty.reset()
	return s
}

func (s *state) diag(sev Severity, object, fieldPath, source, msg string) {
	s.globalDiags = append(s.globalDiags, Diagnostic{Severity: sev, Object: object, Field: fieldPath, Message: msg, Source: source})
}

// namespace returns the namespace of that name, creating it (implied, with
// only its name label) if needed.
func (s *state) namespace(name string) *nsState {
	if ns := s.namespaces[name]; ns != nil {
		return ns
	}
	ns := &nsState{name: name, labels: withNSName(nil, name), pods: roaring.New(), projVer: [2]int{-1, -1}}
	if n := len(s.nsFree); n > 0 {
		ns.id = s.nsFree[n-1]
		s.nsFree = s.nsFree[:n-1]
		s.nsByID[ns.id] = ns
	} else {
		ns.id = uint32(len(s.nsByID))
		s.nsByID = append(s.nsByID, ns)
	}
	ns.tier = newNPTier(ns)
	s.namespaces[name] = ns
	s.nsIndex.add(ns.id, ns.labels)
	s.nsSelsAdd(ns)
	return ns
}

// dropNamespace forgets a namespace nothing refers to any more.
func (s *state) dropNamespace(ns *nsState) {
	if ns.explicit || ns.refs > 0 {
		return
	}
	s.nsSelsRemove(ns)
	s.nsIndex.remove(ns.id, ns.labels)
	delete(s.namespaces, ns.name)
	s.nsByID[ns.id] = nil
	s.nsFree = append(s.nsFree, ns.id)
	delete(s.dirty.relistNS, ns.tier)
}

// withNSName is l with the name label the API server puts on every
// namespace: l itself when it has it already, as namespaces from the API
// do (the compiler keeps the label maps it is given and never changes
// them), else a copy with it added.
func withNSName(l map[string]string, name string) map[string]string {
	if v, ok := l[nsNameLabel]; ok && v == name {
		return l
	}
	out := make(map[string]string, len(l)+1)
	for k, v := range l {
		out[k] = v
	}
	out[nsNameLabel] = name
	return out
}

// allocSlot gives a pod a slot: a stable number for bitmaps and the
// evaluator's index. Slots freed since the last publication are not
// reused before the next one.
func (s *state) allocSlot(ps *podState) {
	if n := len(s.slotFree); n > 0 {
		ps.slot = s.slotFree[n-1]
		s.slotFree = s.slotFree[:n-1]
		s.slots[ps.slot] = ps
		return
	}
	ps.slot = uint32(len(s.slots))
	s.slots = append(s.slots, ps)
}

// addTo adds k to a set, making the set on first use: most sets stay
// small or empty, and a compile makes hundreds of thousands of them.
func addTo[K comparable](m *map[K]struct{}, k K) {
	if *m == nil {
		*m = map[K]struct{}{}
	}
	(*m)[k] = struct{}{}
}

// counts is a counted set of strings kept sorted: the label keys or port
// names a tier's policies read, each with how many policies read it. A
// slice rather than a map because a cluster has a NetworkPolicy tier per
// namespace and direction, most with one or two keys, where even an empty
// map costs a few hundred bytes.
type counts []counted

type counted struct {
	key string
	n   int
}

// add adds d to key's count; it reports whether the set of keys changed.
func (c *counts) add(key string, d int) bool {
	i, found := slices.BinarySearchFunc(*c, key, func(e counted, k string) int { return strings.Compare(e.key, k) })
	switch {
	case !found && d > 0:
		*c = slices.Insert(*c, i, counted{key, d})
		return true
	case !found:
		return false
	}
	n := (*c)[i].n + d
	if n <= 0 {
		*c = slices.Delete(*c, i, i+1)
		return true
	}
	(*c)[i].n = n
	return false
}

// keys lists the keys, sorted.
func (c counts) keys() []string {
	out := make([]string, len(c))
	for i, e := range c {
		out[i] = e.key
	}
	return out
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
