package agent

import (
	"sync"

	"k8s.io/client-go/tools/cache"
)

// objKind is a kind of cached object, for recording what changed.
type objKind int

const (
	kindPod objKind = iota
	kindNamespace
	kindNode
	kindNetworkPolicy
	kindClusterNetworkPolicy
	numKinds
)

// pending collects the keys of the objects that changed since the last
// sync, by kind. It records which objects, not what happened to them: the
// sync reads each from its cache and upserts it, or deletes it when it is
// gone, so any number of events about one object fold into one change and
// the cache is the only truth.
type pending struct {
	mu   sync.Mutex
	keys [numKinds]map[string]struct{}
}

// changed records a change of an object (the object or a tombstone) and
// queues a sync.
func (a *Agent) changed(k objKind, obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		// Not an object of the caches: compile everything to be safe.
		a.log.Error(err, "Cannot key a changed object; compiling in full")
		a.requestResync(resyncChecked)
		return
	}
	p := &a.pending
	p.mu.Lock()
	if p.keys[k] == nil {
		p.keys[k] = map[string]struct{}{}
	}
	p.keys[k][key] = struct{}{}
	p.mu.Unlock()
	a.queue.Add(syncKey)
}

// takeChanges returns and clears the recorded changes.
func (a *Agent) takeChanges() [numKinds]map[string]struct{} {
	p := &a.pending
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.keys
	p.keys = [numKinds]map[string]struct{}{}
	return out
}
