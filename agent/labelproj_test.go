package agent

import (
	"maps"
	"testing"

	"github.com/moat-net/moat/agent/internal/fixture"
)

// Labels no policy reads are packed away in the pod cache and come back,
// exactly, when policies start to read them.
func TestLabelsPackedAwayComeBack(t *testing.T) {
	all := map[string]string{"app": "web", "tier": "front", "pod-template-hash": "7d9f8c6b5a", "": "empty-key", "x": "", "a/b=c": "v,w\x00"}
	readApp := &keySet{"app": {}}
	readMore := &keySet{"app": {}, "pod-template-hash": {}, "a/b=c": {}, "x": {}}
	for _, tc := range []struct {
		name     string
		cachedAs *keySet
		readAs   *keySet
		want     map[string]string
	}{
		{"unknown keys keep everything", nil, nil, all},
		{"read as cached", readApp, readApp, map[string]string{"app": "web"}},
		{"a key read later comes back", readApp, readMore, map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5a", "a/b=c": "v,w\x00", "x": ""}},
		{"every label when keys become unknown", readApp, nil, all},
		{"nothing read", &keySet{}, &keySet{"tier": {}}, map[string]string{"tier": "front"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fixture.Pod("ns", "p", "n1", maps.Clone(all), nil, "10.0.0.1")
			o, err := newLabelSets().toCachedPod(p, tc.cachedAs)
			if err != nil {
				t.Fatal(err)
			}
			c := o.(*cachedPod)
			got := c.labelsFor(tc.readAs)
			if !maps.Equal(got, tc.want) {
				t.Fatalf("labels %q, want %q", got, tc.want)
			}
			if tc.cachedAs != nil && len(c.Labels) > len(*tc.cachedAs) {
				t.Fatalf("cached %q: keys no policy reads kept in the map", c.Labels)
			}
			if pod := c.podFor(tc.readAs); !maps.Equal(pod.Labels, tc.want) || pod.Name != "p" {
				t.Fatalf("podFor: %+v", pod)
			}
		})
	}
}

// Two versions of a pod cached under different key sets never compare as
// equal labels: what was packed away under one may be read under the
// other, so the update must reach the compiler.
func TestUpdateUnderNewKeysIsNotDropped(t *testing.T) {
	ls := newLabelSets()
	labels := map[string]string{"app": "web", "team": "a"}
	k1, k2 := &keySet{"app": {}}, &keySet{"app": {}, "team": {}}
	old, _ := ls.toCachedPod(fixture.Pod("ns", "p", "n1", maps.Clone(labels), nil, "10.0.0.1"), k1)
	labels["team"] = "b"
	cur1, _ := ls.toCachedPod(fixture.Pod("ns", "p", "n1", maps.Clone(labels), nil, "10.0.0.1"), k1)
	cur2, _ := ls.toCachedPod(fixture.Pod("ns", "p", "n1", maps.Clone(labels), nil, "10.0.0.1"), k2)
	// What the pod informer's update handler asks (informers.go): a
	// change, of labels only, of versions cached under the current keys,
	// none of them read.
	ignored := func(old, cur any, now *keySet) bool {
		_, relabel := relabelOnly(old, cur)
		return podChanged(old, cur) && relabel && cachedUnder(old, cur, now) && !now.mentions(old.(*cachedPod).Labels, cur.(*cachedPod).Labels)
	}
	if !ignored(old, cur1, k1) {
		t.Error("a change of a key no policy reads is not ignored")
	}
	if !podChanged(old, cur2) || ignored(old, cur2, k2) || ignored(old, cur2, k1) {
		t.Error("versions cached under different keys compare as the same")
	}
	// Both versions cached before the keys grew to read team: a
	// compilation may have read the old version after the keys grew, so
	// the update must reach it.
	if ignored(old, cur1, k2) {
		t.Error("a change of a key read now, of versions cached before it was, is ignored")
	}
}
