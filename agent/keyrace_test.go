package agent

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// The label key set and the policies compiled must come from one reading
// of the policy cache (labelkeys.go). The informer keeps storing new
// versions while a sync runs: a version whose selector reads a key the
// set lacks, stored between a reading that decides the key set and
// another that takes the policies to compile, would be compiled against
// pods projected without that key. Its subject then selects nothing, and
// the pods it isolates stay open until a later sync.
//
// TestKeySetCoversCompiledPolicies lands such a version after each read
// of the NetworkPolicy cache in turn, during an incremental sync (a
// change of the policy pending) and during a full one (a resync). Every
// version of a/p isolates a/x (the first by app, the second by color, a
// key no policy read before), so no Program may let a/y reach a/x.
func TestKeySetCoversCompiledPolicies(t *testing.T) {
	for _, resync := range []bool{false, true} {
		name := "incremental"
		if resync {
			name = "full"
		}
		t.Run(name, func(t *testing.T) {
			at := 1
			for keyRaceAt(t, resync, at) {
				at++
			}
			if at == 1 {
				t.Fatal("the compile never read the NetworkPolicy cache: the test proves nothing")
			}
		})
	}
}

// keyRaceAt runs one interleaving: the second version of a/p is stored
// right after the compile's at-th read of the NetworkPolicy cache. It
// reports whether the compile read that often.
func keyRaceAt(t *testing.T, resync bool, at int) bool {
	t.Helper()
	c := newFakeCluster(t)
	a, err := New(Config{NodeName: "n1"}, Clients{Kube: c.kube, Dynamic: c.dyn}, newTestDP("n1"))
	if err != nil {
		t.Fatal(err)
	}
	add := func(inf cache.SharedIndexInformer, o any) {
		if err := inf.GetStore().Add(o); err != nil {
			t.Fatal(err)
		}
	}
	version := func(gen int, selector string) *decodedNP {
		return a.labelSets.decodeNP(fixture.YAML(t, fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a, uid: u1, generation: %d}
spec:
  podSelector: {matchLabels: {%s}}
  policyTypes: [Ingress]
`, gen, selector)))
	}
	v1, v2 := version(1, "app: x"), version(2, "color: red")
	add(a.inf.nps, v1)
	// The pods arrive under the key set {app}, as the informer's
	// transform caches them: color is packed away.
	a.updateSelectorKeys(a.cachedKeyLists())
	add(a.inf.namespaces, &cachedNamespace{policy.Namespace{Name: "a"}})
	n, _ := toCachedNode(fixture.Node("n1", nil, "192.168.0.1"))
	add(a.inf.nodes, n)
	for _, p := range []runtime.Object{
		fixture.Pod("a", "x", "n1", map[string]string{"app": "x", "color": "red"}, nil, "10.0.0.1"),
		fixture.Pod("a", "y", "n1", map[string]string{"app": "y"}, nil, "10.0.0.2"),
	} {
		o, _ := a.labelSets.toCachedPod(p, a.selectorKeys.Load())
		add(a.inf.pods, o)
	}
	isolated := func(when string, prog *policy.Program) {
		t.Helper()
		x, ok := prog.PodByIP(netip.MustParseAddr("10.0.0.1"))
		if !ok {
			t.Fatalf("%s: no pod a/x in the program", when)
		}
		v := prog.Evaluate(policy.Flow{Src: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.0.0.2")}, Dst: policy.Endpoint{Pod: x, Addr: netip.MustParseAddr("10.0.0.1")}, Proto: policy.ProtoTCP, Port: 80})
		if v.Allowed {
			gen := int64(0)
			if np := a.compiler.NetworkPolicies([]string{"a/p"})["a/p"]; np != nil {
				gen = np.Generation
			}
			t.Errorf("version 2 stored after read %d of the cache, %s: a/y reaches a/x, which every version of a/p isolates (compiled: generation %d; key set %v)", at, when, gen, *a.selectorKeys.Load())
		}
	}
	if prog, full, _ := a.compile(false); !full {
		t.Fatal("first compile not full")
	} else {
		isolated("first compile", prog)
	}

	if !resync {
		// An update of a/p is pending: the sync compiles it incrementally.
		a.changed(kindNetworkPolicy, v1)
	}
	real := a.inf.nps
	hook := &landingStore{Store: real.GetStore(), at: at, land: func() {
		// The informer stores the version, then tells the handlers.
		if err := real.GetStore().Update(v2); err != nil {
			t.Error(err)
		}
		a.changed(kindNetworkPolicy, v2)
	}}
	a.inf.nps = &storeInformer{SharedIndexInformer: real, store: hook}
	prog, _, _ := a.compile(resync)
	a.inf.nps = real
	if hook.reads < at {
		return false
	}
	isolated("the sync in which it landed", prog)
	// The version's own event: the next sync compiles it.
	prog, _, _ = a.compile(false)
	isolated("the next sync", prog)
	if np := a.compiler.NetworkPolicies([]string{"a/p"})["a/p"]; np == nil || np.Generation != 2 {
		t.Errorf("version 2 stored after read %d of the cache: the next sync compiled %+v, want generation 2", at, np)
	}
	return true
}

// landingStore runs land right after the at-th read of the store (List,
// GetByKey, Get or ListKeys): a new version stored by the informer at
// that point of a sync.
type landingStore struct {
	cache.Store
	at, reads int
	land      func()
}

func (s *landingStore) read() {
	s.reads++
	if s.reads == s.at {
		s.land()
	}
}

func (s *landingStore) List() []any {
	defer s.read()
	return s.Store.List()
}

func (s *landingStore) ListKeys() []string {
	defer s.read()
	return s.Store.ListKeys()
}

func (s *landingStore) Get(o any) (any, bool, error) {
	defer s.read()
	return s.Store.Get(o)
}

func (s *landingStore) GetByKey(key string) (any, bool, error) {
	defer s.read()
	return s.Store.GetByKey(key)
}

// storeInformer is an informer whose GetStore is store.
type storeInformer struct {
	cache.SharedIndexInformer
	store cache.Store
}

func (i *storeInformer) GetStore() cache.Store { return i.store }

// isolationDP checks every Program handed to the dataplane once armed:
// a/y must never reach a/x.
type isolationDP struct {
	*testDP
	mu    sync.Mutex
	armed bool
	syncs int
	open  []int
}

func (d *isolationDP) Sync(ctx context.Context, prog *policy.Program) (nft.Result, error) {
	x, ok := prog.PodByIP(netip.MustParseAddr("10.0.0.1"))
	allowed := ok && prog.Evaluate(policy.Flow{Src: policy.Endpoint{Pod: -1, Addr: netip.MustParseAddr("10.0.0.2")}, Dst: policy.Endpoint{Pod: x, Addr: netip.MustParseAddr("10.0.0.1")}, Proto: policy.ProtoTCP, Port: 80}).Allowed
	d.mu.Lock()
	if d.armed {
		d.syncs++
		if allowed {
			d.open = append(d.open, d.syncs)
		}
	}
	d.mu.Unlock()
	return d.testDP.Sync(ctx, prog)
}

// TestKeySetRaceWithTheInformers is the race of
// TestKeySetCoversCompiledPolicies with the real informer goroutines: a/p
// is updated in quick succession, each version selecting a/x by a key no
// earlier version read, and every Program synced meanwhile must keep a/x
// isolated. Pods with labels no policy reads widen the window: each full
// compilation projects them again.
func TestKeySetRaceWithTheInformers(t *testing.T) {
	const versions = 300
	xl := map[string]string{"app": "x"}
	for i := range versions {
		xl[fmt.Sprint("k", i)] = "v"
	}
	objs := []runtime.Object{
		fixture.Namespace("a", nil), fixture.Node("n1", nil, "192.168.0.1"),
		fixture.Pod("a", "x", "n1", xl, nil, "10.0.0.1"),
		fixture.Pod("a", "y", "n1", map[string]string{"app": "y"}, nil, "10.0.0.2"),
	}
	for i := range 3000 {
		l := map[string]string{"app": "bulk"}
		for j := range 8 {
			l[fmt.Sprint("noise", j)] = fmt.Sprint(i)
		}
		objs = append(objs, fixture.Pod("b", fmt.Sprint("bulk-", i), "n2", l, nil, fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)))
	}
	np := func(i int) *unstructured.Unstructured {
		return fixture.YAML(t, fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: p, namespace: a, generation: %d}
spec:
  podSelector: {matchLabels: {k%d: v}}
  policyTypes: [Ingress]
`, i+1, i))
	}
	c := newFakeCluster(t, append(objs, np(0))...)
	dp := &isolationDP{testDP: newTestDP("n1")}
	a := startReady(t, c, Config{NodeName: "n1", Resync: time.Hour}, dp)
	settle(t, a)
	dp.mu.Lock()
	dp.armed = true
	dp.mu.Unlock()
	ctx := context.Background()
	res := c.dyn.Resource(networkPolicyGVR).Namespace("a")
	for i := 1; i < versions; i++ {
		cur, err := res.Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u := np(i)
		u.SetResourceVersion(cur.GetResourceVersion())
		if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			// Let some syncs start between the updates.
			time.Sleep(time.Duration(i%7) * time.Millisecond)
		}
	}
	settle(t, a)
	dp.mu.Lock()
	defer dp.mu.Unlock()
	t.Logf("%d syncs; compilations: %s full, %s incremental", dp.syncs, testutilValue(t, a, "moat_agent_compilations_total", `kind="full"`), testutilValue(t, a, "moat_agent_compilations_total", `kind="incremental"`))
	if len(dp.open) > 0 {
		t.Errorf("%d of %d synced Programs let a/y reach a/x, which every version of a/p isolates (syncs %v)", len(dp.open), dp.syncs, dp.open)
	}
	// The race needs syncs while the updates arrive: with the first sync
	// and one after the burst alone, nothing above was exercised.
	if dp.syncs <= 2 {
		t.Errorf("%d syncs over %d updates: no sync ran while they arrived, so the race was not exercised", dp.syncs, versions-1)
	}
}
