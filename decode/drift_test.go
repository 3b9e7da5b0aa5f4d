package decode

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/randfill"

	"github.com/moat-net/moat/api/v1alpha2"
	"github.com/moat-net/moat/policy"
)

// The decoders are written by hand for speed; these tests keep them true
// to the Go types. Random objects are marshalled with encoding/json and
// decoded both by encoding/json and by this package, from bytes and from
// the unstructured map: every field the types have must come out the
// same, and nothing may be reported unknown or invalid.

func filler(seed int64) *randfill.Filler {
	return randfill.NewWithSeed(seed).NilChance(0.3).NumElements(0, 3).Funcs(
		func(q *resource.Quantity, c randfill.Continue) { *q = resource.MustParse("1") },
		func(t *metav1.Time, c randfill.Continue) { *t = metav1.Unix(c.Int63n(1<<32), 0) },
		func(f *[]metav1.ManagedFieldsEntry, c randfill.Continue) { *f = nil },
	)
}

// decodeBoth decodes js from bytes and from its unstructured map and
// requires the two to agree.
func decodeBoth(t *testing.T, js []byte) *Object {
	t.Helper()
	var fromBytes Result
	if err := fromBytes.DecodeJSON("b", bytes.NewReader(js)); err != nil {
		t.Fatalf("decode: %v\n%s", err, js)
	}
	var m map[string]any
	if err := utiljson.Unmarshal(js, &m); err != nil { // as client-go's unstructured objects
		t.Fatal(err)
	}
	o, err := Unstructured("b#1", m)
	if err != nil {
		t.Fatal(err)
	}
	var fromMap Result
	fromMap.Add(o)
	if diff := cmp.Diff(fromBytes.Cluster, fromMap.Cluster, cmp.Comparer(func(a, b *policy.NetworkPolicy) bool { return reflect.DeepEqual(a, b) })); diff != "" {
		t.Fatalf("bytes and map decode differently (-bytes +map):\n%s\n%s", diff, js)
	}
	return o
}

func TestDriftNetworkPolicy(t *testing.T) {
	for seed := range int64(300) {
		var np networkingv1.NetworkPolicy
		filler(seed).Fill(&np)
		np.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
		np.Name = "p" + np.Name
		js, err := json.Marshal(&np)
		if err != nil {
			t.Fatal(err)
		}
		var want networkingv1.NetworkPolicy
		if err := json.Unmarshal(js, &want); err != nil {
			t.Fatal(err)
		}
		want.TypeMeta = metav1.TypeMeta{}
		want.ObjectMeta = keptMeta(&want.ObjectMeta, true)
		o := decodeBoth(t, js)
		if o.NetworkPolicy == nil {
			t.Fatalf("seed %d: not decoded: %+v", seed, o)
		}
		got := o.NetworkPolicy
		if len(got.UnknownFields()) > 0 || len(got.Invalid()) > 0 {
			t.Fatalf("seed %d: unknown %v, invalid %v\n%s", seed, got.UnknownFields(), got.Invalid(), js)
		}
		wantNP := policy.NetworkPolicyFromAPI(&want)
		wantNP.Source = got.Source
		if diff := cmp.Diff(wantNP, got); diff != "" {
			t.Fatalf("seed %d: (-encoding/json +decode):\n%s\n%s", seed, diff, js)
		}
	}
}

func TestDriftClusterNetworkPolicy(t *testing.T) {
	for seed := range int64(300) {
		var cnp v1alpha2.ClusterNetworkPolicy
		filler(seed).Fill(&cnp)
		cnp.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha2.SchemeGroupVersion.String(), Kind: "ClusterNetworkPolicy"}
		cnp.Name = "c" + cnp.Name
		js, err := json.Marshal(&cnp)
		if err != nil {
			t.Fatal(err)
		}
		var want v1alpha2.ClusterNetworkPolicy
		if err := json.Unmarshal(js, &want); err != nil {
			t.Fatal(err)
		}
		want.TypeMeta = metav1.TypeMeta{}
		want.ObjectMeta = keptMeta(&want.ObjectMeta, false)
		o := decodeBoth(t, js)
		if o.ClusterNetworkPolicy == nil {
			t.Fatalf("seed %d: not decoded: %+v", seed, o)
		}
		got := o.ClusterNetworkPolicy
		if len(got.UnknownFields) > 0 || len(got.Invalid) > 0 {
			t.Fatalf("seed %d: unknown %v, invalid %v\n%s", seed, got.UnknownFields, got.Invalid, js)
		}
		if diff := cmp.Diff(&want, got.ClusterNetworkPolicy); diff != "" {
			t.Fatalf("seed %d: (-encoding/json +decode):\n%s\n%s", seed, diff, js)
		}
	}
}

// keptMeta is the metadata the decoder keeps of a policy.
func keptMeta(m *metav1.ObjectMeta, namespaced bool) metav1.ObjectMeta {
	out := metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation}
	if namespaced && out.Namespace == "" {
		out.Namespace = defaultNamespace
	}
	return out
}

// Pods and nodes: what the decoder builds must be what policy.PodFromAPI
// and NodeFromAPI make of the fully decoded object.
func TestDriftInventory(t *testing.T) {
	for seed := range int64(200) {
		var pod corev1.Pod
		f := filler(seed)
		f.Fill(&pod.ObjectMeta)
		f.Fill(&pod.Spec.Containers)
		f.Fill(&pod.Spec.InitContainers)
		f.Fill(&pod.Status)
		pod.Spec.NodeName, pod.Spec.HostNetwork = "n", seed%3 == 0
		pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		pod.Name = "p" + pod.Name
		js, err := json.Marshal(&pod)
		if err != nil {
			t.Fatal(err)
		}
		var typed corev1.Pod
		if err := json.Unmarshal(js, &typed); err != nil {
			t.Fatal(err)
		}
		if typed.Namespace == "" {
			typed.Namespace = defaultNamespace
		}
		o := decodeBoth(t, js)
		if p := typed.Status.Phase; p == corev1.PodSucceeded || p == corev1.PodFailed {
			if o.Skipped == "" {
				t.Fatalf("seed %d: finished pod not skipped", seed)
			}
			continue
		}
		want, wantDiags := policy.PodFromAPI(&typed)
		if o.Pod == nil {
			t.Fatalf("seed %d: not decoded: %+v", seed, o.Diagnostics)
		}
		if diff := cmp.Diff(want, *o.Pod, cmp.Comparer(func(a, b interface{ String() string }) bool { return a.String() == b.String() })); diff != "" {
			t.Fatalf("seed %d: (-PodFromAPI +decode):\n%s", seed, diff)
		}
		for i := range o.Diagnostics {
			o.Diagnostics[i].Source = ""
		}
		if diff := cmp.Diff(wantDiags, o.Diagnostics); diff != "" {
			t.Fatalf("seed %d: diagnostics (-PodFromAPI +decode):\n%s", seed, diff)
		}
	}
	for seed := range int64(100) {
		var node corev1.Node
		f := filler(seed)
		f.Fill(&node.ObjectMeta)
		f.Fill(&node.Status.Addresses)
		node.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
		node.Name = "n" + node.Name
		js, err := json.Marshal(&node)
		if err != nil {
			t.Fatal(err)
		}
		var typed corev1.Node
		if err := json.Unmarshal(js, &typed); err != nil {
			t.Fatal(err)
		}
		want, _ := policy.NodeFromAPI(&typed)
		o := decodeBoth(t, js)
		if o.Node == nil {
			t.Fatalf("seed %d: not decoded: %+v", seed, o.Diagnostics)
		}
		if diff := cmp.Diff(want, *o.Node, cmp.Comparer(func(a, b interface{ String() string }) bool { return a.String() == b.String() })); diff != "" {
			t.Fatalf("seed %d: (-NodeFromAPI +decode):\n%s", seed, diff)
		}
	}
}
