package agent

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/moat-net/moat/agent/internal/fixture"
)

func TestLabelSetsShareAndForget(t *testing.T) {
	ls := newLabelSets()
	pods := make([]*cachedPod, 0, 200)
	for i := range 200 {
		p := fixture.Pod("a", fmt.Sprint("p", i), "n1", map[string]string{"app": fmt.Sprint("app-", i%4), "tier": "web"}, nil, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
		o, err := ls.toCachedPod(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, o.(*cachedPod))
	}
	if n := ls.len(); n != 4 {
		t.Fatalf("%d label sets for 4 distinct label maps", n)
	}
	for i, p := range pods {
		if p.Labels["app"] != fmt.Sprint("app-", i%4) || p.Labels["tier"] != "web" || len(p.Labels) != 2 {
			t.Fatalf("pod %d labels %v", i, p.Labels)
		}
		if p.labels != pods[i%4].labels {
			t.Fatalf("pod %d does not share the set of pod %d", i, i%4)
		}
	}
	noLabels, _ := ls.toCachedPod(&corev1.Pod{}, nil)
	if noLabels.(*cachedPod).labels != nil {
		t.Error("a pod without labels got a set")
	}
	// Pods gone: the sets go with them, and so do their entries.
	pods = nil
	deadline := time.Now().Add(10 * time.Second)
	for ls.len() > 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := ls.len(); n != 0 {
		t.Errorf("%d label sets left after every pod was dropped", n)
	}
	runtime.KeepAlive(pods)
}

func TestLabelSetHash(t *testing.T) {
	ls := newLabelSets()
	a := ls.hash(map[string]string{"b": "2", "a": "1"})
	if a != ls.hash(map[string]string{"a": "1", "b": "2"}) {
		t.Error("equal maps hash differently")
	}
	if a == ls.hash(map[string]string{"a": "1b", "": "2"}) || a == ls.hash(map[string]string{"a": "1", "b": "3"}) {
		t.Error("different maps collide")
	}
	// Colliding or not, different maps are different sets.
	x, y := ls.intern(map[string]string{"a": "1"}), ls.intern(map[string]string{"a": "2"})
	if x == y || x.m["a"] != "1" || y.m["a"] != "2" {
		t.Error("different maps share a set")
	}
}
