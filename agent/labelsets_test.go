package agent

import (
	"fmt"
	"hash/maphash"
	"runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/agent/internal/fixture"
	"github.com/moat-net/moat/policy"
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
	seed := maphash.MakeSeed()
	hash := func(l map[string]string) uint64 {
		var h maphash.Hash
		h.SetSeed(seed)
		hashLabels(&h, l)
		return h.Sum64()
	}
	a := hash(map[string]string{"b": "2", "a": "1"})
	if a != hash(map[string]string{"a": "1", "b": "2"}) {
		t.Error("equal maps hash differently")
	}
	if a == hash(map[string]string{"a": "1b", "": "2"}) || a == hash(map[string]string{"a": "1", "b": "3"}) {
		t.Error("different maps collide")
	}
	// Colliding or not, different maps are different sets.
	x, y := ls.intern(map[string]string{"a": "1"}), ls.intern(map[string]string{"a": "2"})
	if x == y || x.v["a"] != "1" || y.v["a"] != "2" {
		t.Error("different maps share a set")
	}
}

// TestPodPortsShared: pods declaring equal ports share one list, which
// reads the same; different lists are not shared.
func TestPodPortsShared(t *testing.T) {
	ls := newLabelSets()
	pod := func(name string, ports ...corev1.ContainerPort) *cachedPod {
		o, err := ls.toCachedPod(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name},
			Spec:       corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status:     corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*cachedPod)
	}
	web := []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}}
	a, b := pod("a", web...), pod("b", web...)
	c := pod("c", corev1.ContainerPort{Name: "http", ContainerPort: 8081})
	if a.ports == nil || a.ports != b.ports || &a.Ports[0] != &b.Ports[0] {
		t.Error("equal port lists are not shared")
	}
	if c.ports == a.ports || c.Ports[0].Port != 8081 {
		t.Errorf("different port lists shared or changed: %v", c.Ports)
	}
	want := []policy.ContainerPort{{Name: "http", Protocol: policy.ProtoTCP, Port: 8080}, {Name: "metrics", Protocol: policy.ProtoTCP, Port: 9090}}
	if !slices.Equal(b.Ports, want) {
		t.Errorf("shared ports read %v, want %v", b.Ports, want)
	}
	if pod("d").ports != nil {
		t.Error("a pod without ports holds a shared list")
	}
}
