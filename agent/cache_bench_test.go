package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/moat-net/moat/internal/clustergen"
)

// realisticPod dresses a generated pod as the API server sends it for a
// typical workload: owner reference, annotations, managed fields of three
// writers, a container with env, resources, probes and a volume, and a
// running status with conditions.
func realisticPod(p corev1.Pod, i int) *corev1.Pod {
	p = *p.DeepCopy()
	now := metav1.NewTime(time.Unix(1_700_000_000, 0))
	p.UID = types.UID(fmt.Sprintf("0b7c3c53-8f0e-4b62-9d5e-%012d", i))
	p.ResourceVersion = fmt.Sprint(100000 + i)
	p.CreationTimestamp = now
	p.GenerateName = p.Name[:len(p.Name)-2]
	p.Annotations = map[string]string{"kubectl.kubernetes.io/restartedAt": now.String(), "prometheus.io/scrape": "true"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.GenerateName, UID: "5a1c0e77-1d9b-4a39-8e44-2f0b6a3c9d10"}}
	fields := metav1.NewFieldsV1(`{"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:tier":{},"f:version":{}},"f:ownerReferences":{}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:image":{},"f:name":{},"f:ports":{},"f:resources":{}}}}}`)
	for _, m := range []string{"kube-controller-manager", "kubelet", "kube-scheduler"} {
		p.ManagedFields = append(p.ManagedFields, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &now, FieldsType: "FieldsV1", FieldsV1: fields})
	}
	c := &p.Spec.Containers[0]
	c.Image = "registry.example.com/team/app:v1.2.3"
	c.Env = []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
	c.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz"}}}
	c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}
	p.Spec.ServiceAccountName = "default"
	p.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIP = "172.16.0.1"
	p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
	p.Status.StartTime = &now
	for _, t := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized, corev1.PodScheduled} {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Ready: true, Image: c.Image, ImageID: "sha256:0123456789abcdef", ContainerID: "containerd://abcdef0123456789"}}
	return &p
}

// BenchmarkPodCacheMemory measures what one pod of issue 8's workload
// shape (pods of a ReplicaSet share their labels, a StatefulSet's pods
// each have their own) costs in the agent's pod informer cache
// (toCachedPod), against the object as received (bytes-per-pod of Go heap
// with 10,000 pods stored).
//
//	go test -run '^$' -bench BenchmarkPodCacheMemory -benchtime 1x ./agent/
func BenchmarkPodCacheMemory(b *testing.B) {
	gen := clustergen.Generate(clustergen.Config{Nodes: 100, Namespaces: 1000, Pods: 10000, Seed: 1, Workloads: true})
	shared, sharedRead := newLabelSets(), newLabelSets()
	readKeys := &keySet{"app": {}, "tier": {}}
	for _, tc := range []struct {
		name      string
		transform cache.TransformFunc
	}{
		{"cached", toCachedPod},
		{"cached-shared-labels", func(o any) (any, error) { return shared.toCachedPod(o, nil) }},
		// The keys the generated policies read (app, tier; namespaces'
		// keys do not matter here): the other labels are packed away.
		{"cached-shared-read-labels", func(o any) (any, error) { return sharedRead.toCachedPod(o, readKeys) }},
		{"as-received", func(o any) (any, error) { return o, nil }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var perPod float64
			for b.Loop() {
				goruntime.GC()
				var before, after goruntime.MemStats
				goruntime.ReadMemStats(&before)
				store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
				for i := range gen.Pods {
					o, err := tc.transform(realisticPod(gen.Pods[i], i))
					if err != nil {
						b.Fatal(err)
					}
					if err := store.Add(o); err != nil {
						b.Fatal(err)
					}
				}
				goruntime.GC()
				goruntime.ReadMemStats(&after)
				perPod = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(gen.Pods))
				goruntime.KeepAlive(store)
			}
			b.ReportMetric(perPod, "bytes/pod")
		})
	}
}

// BenchmarkPolicyCacheMemory measures what a NetworkPolicy and a
// ClusterNetworkPolicy of the generated mix cost in the agent's caches
// (strictly decoded, as the informers store them), with their selectors'
// maps not shared and shared.
//
//	go test -run '^$' -bench BenchmarkPolicyCacheMemory -benchtime 1x ./agent/
func BenchmarkPolicyCacheMemory(b *testing.B) {
	gen := clustergen.Generate(clustergen.Config{Nodes: 100, Namespaces: 1000, Pods: 1000, NetworkPolicies: 5000, ClusterPolicies: 1000, Seed: 1, Workloads: true})
	var nps, cnps []*unstructured.Unstructured
	for i := range gen.NetworkPolicies {
		o, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&gen.NetworkPolicies[i])
		if err != nil {
			b.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: o}
		u.SetAPIVersion("networking.k8s.io/v1")
		u.SetKind("NetworkPolicy")
		nps = append(nps, u)
	}
	for i := range gen.ClusterNetworkPolicies {
		o, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&gen.ClusterNetworkPolicies[i])
		if err != nil {
			b.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: o}
		u.SetAPIVersion("policy.networking.k8s.io/v1alpha2")
		u.SetKind("ClusterNetworkPolicy")
		cnps = append(cnps, u)
	}
	shared := newLabelSets()
	for _, tc := range []struct {
		name   string
		objs   []*unstructured.Unstructured
		decode func(*unstructured.Unstructured) any
	}{
		{"NetworkPolicy", nps, func(u *unstructured.Unstructured) any { return decodeNP(u) }},
		{"ClusterNetworkPolicy", cnps, func(u *unstructured.Unstructured) any { return decodeCNP(u) }},
		// As the agent's informers decode: selectors shared.
		{"NetworkPolicy/shared", nps, func(u *unstructured.Unstructured) any { return shared.decodeNP(u) }},
		{"ClusterNetworkPolicy/shared", cnps, func(u *unstructured.Unstructured) any { return shared.decodeCNP(u) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var per float64
			for b.Loop() {
				var before, after goruntime.MemStats
				goruntime.GC()
				goruntime.ReadMemStats(&before)
				store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
				for _, u := range tc.objs {
					if err := store.Add(tc.decode(u.DeepCopy())); err != nil {
						b.Fatal(err)
					}
				}
				goruntime.GC()
				goruntime.ReadMemStats(&after)
				per = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(tc.objs))
				goruntime.KeepAlive(store)
			}
			b.ReportMetric(per, "bytes/object")
		})
	}
}

// BenchmarkWireBytes reports what one object of the generated workload
// shape costs on the wire to an agent, as the API server sends it
// (clustergen.WriteJSON's APIServer style: realistic noise, managedFields):
// protobuf bytes per pod and per node (the agent's pods, nodes and
// namespaces watches use protobuf) and JSON bytes per NetworkPolicy (the
// policy watches use JSON). A watch event is the object plus a few bytes
// of framing.
//
//	go test -run '^$' -bench BenchmarkWireBytes -benchtime 1x ./agent/
func BenchmarkWireBytes(b *testing.B) {
	gen := clustergen.Generate(clustergen.Config{Nodes: 20, Namespaces: 100, Pods: 1000, NetworkPolicies: 700, ClusterPolicies: 50, Seed: 1, Workloads: true})
	var buf bytes.Buffer
	if err := gen.WriteJSON(&buf, clustergen.APIServer); err != nil {
		b.Fatal(err)
	}
	var list struct{ Items []json.RawMessage }
	if err := json.Unmarshal(buf.Bytes(), &list); err != nil {
		b.Fatal(err)
	}
	sizes := map[string][]int{}
	for b.Loop() {
		clear(sizes)
		for _, raw := range list.Items {
			var head struct{ Kind string }
			if err := json.Unmarshal(raw, &head); err != nil {
				b.Fatal(err)
			}
			var obj interface{ Marshal() ([]byte, error) }
			switch head.Kind {
			case "Pod":
				obj = &corev1.Pod{}
			case "Node":
				obj = &corev1.Node{}
			case "Namespace":
				obj = &corev1.Namespace{}
			default:
				sizes[head.Kind] = append(sizes[head.Kind], len(raw))
				continue
			}
			if err := json.Unmarshal(raw, obj); err != nil {
				b.Fatal(err)
			}
			pb, err := obj.Marshal()
			if err != nil {
				b.Fatal(err)
			}
			sizes[head.Kind] = append(sizes[head.Kind], len(pb))
		}
	}
	mean := func(kind string) float64 {
		n := 0
		for _, s := range sizes[kind] {
			n += s
		}
		return float64(n) / float64(max(len(sizes[kind]), 1))
	}
	b.ReportMetric(mean("Pod"), "pod-protobuf-bytes")
	b.ReportMetric(mean("Node"), "node-protobuf-bytes")
	b.ReportMetric(mean("Namespace"), "namespace-protobuf-bytes")
	b.ReportMetric(mean("NetworkPolicy"), "networkpolicy-json-bytes")
	b.ReportMetric(mean("ClusterNetworkPolicy"), "clusternetworkpolicy-json-bytes")
}
