package clustergen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// JSONStyle is the shape of a JSON dump.
type JSONStyle int

const (
	// Kubectl is what `kubectl get -A -o json` prints: one List with
	// kubectl's key order ("kind" after "items"), four-space indentation,
	// managedFields left out (kubectl's --show-managed-fields=false).
	Kubectl JSONStyle = iota
	// APIServer is what the API server returns for a list: compact JSON,
	// managedFields included.
	APIServer
)

func (s JSONStyle) String() string {
	if s == APIServer {
		return "apiserver"
	}
	return "kubectl"
}

// WriteJSON writes the cluster as one List in the given style, each object
// carrying what real objects carry besides what policy reads: annotations,
// owner references, container specs (images, env, resources, probes,
// volume mounts), volumes, tolerations, status conditions and container
// statuses, node images and system info, last-applied-configuration and
// status conditions of policies, and (APIServer) managedFields. Decoding
// benchmarks then read bytes of a realistic size and shape; the policy
// content is Generate's. Output is deterministic.
func (c *Cluster) WriteJSON(w io.Writer, style JSONStyle) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	var compact, pretty bytes.Buffer
	enc := json.NewEncoder(&compact)
	enc.SetEscapeHTML(false)
	open, sep, end := `{"apiVersion":"v1","items":[`, ",", `],"kind":"List","metadata":{"resourceVersion":""}}`+"\n"
	if style == Kubectl {
		open, sep = "{\n    \"apiVersion\": \"v1\",\n    \"items\": [\n        ", ",\n        "
		end = "\n    ],\n    \"kind\": \"List\",\n    \"metadata\": {\n        \"resourceVersion\": \"\"\n    }\n}\n"
	}
	if _, err := bw.WriteString(open); err != nil {
		return err
	}
	n := 0
	item := func(v any, m *metav1.ObjectMeta) error {
		if style == Kubectl {
			m.ManagedFields = nil
		}
		if n > 0 {
			if _, err := bw.WriteString(sep); err != nil {
				return err
			}
		}
		n++
		compact.Reset()
		if err := enc.Encode(v); err != nil {
			return err
		}
		out := bytes.TrimSuffix(compact.Bytes(), []byte("\n"))
		if style == Kubectl {
			pretty.Reset()
			if err := json.Indent(&pretty, out, "        ", "    "); err != nil {
				return err
			}
			out = pretty.Bytes()
		}
		_, err := bw.Write(out)
		return err
	}
	for i := range c.Namespaces {
		ns := noisyNamespace(c.Namespaces[i], i)
		if err := item(ns, &ns.ObjectMeta); err != nil {
			return err
		}
	}
	for i := range c.Nodes {
		node := noisyNode(c.Nodes[i], i)
		if err := item(node, &node.ObjectMeta); err != nil {
			return err
		}
	}
	for i := range c.Pods {
		pod := noisyPod(c.Pods[i], i)
		if err := item(pod, &pod.ObjectMeta); err != nil {
			return err
		}
	}
	for i := range c.NetworkPolicies {
		np := c.NetworkPolicies[i]
		np.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
		if err := item(withApplied(&np, &np.ObjectMeta, i), &np.ObjectMeta); err != nil {
			return err
		}
	}
	for i := range c.ClusterNetworkPolicies {
		cnp := c.ClusterNetworkPolicies[i]
		cnp.TypeMeta = metav1.TypeMeta{APIVersion: "policy.networking.k8s.io/v1alpha2", Kind: "ClusterNetworkPolicy"}
		cnp.Status.Conditions = []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, ObservedGeneration: 1, LastTransitionTime: epoch(i), Reason: "Accepted", Message: "enforced as written"}}
		if err := item(withApplied(&cnp, &cnp.ObjectMeta, i), &cnp.ObjectMeta); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString(end); err != nil {
		return err
	}
	return bw.Flush()
}

func epoch(i int) metav1.Time {
	return metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i%86400) * time.Second))
}

func uid(kind string, i int) types.UID {
	return types.UID(fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", i*2654435761%(1<<32), i%65536, i%4096, (i/7)%4096, i*40503))
}

// commonMeta is what the API server adds to every object.
func commonMeta(m *metav1.ObjectMeta, kind string, i int) {
	m.UID = uid(kind, i)
	m.ResourceVersion = fmt.Sprint(1000000 + i*7)
	m.CreationTimestamp = epoch(i)
}

func noisyNamespace(ns corev1.Namespace, i int) *corev1.Namespace {
	ns.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}
	commonMeta(&ns.ObjectMeta, "ns", i)
	ns.ManagedFields = []metav1.ManagedFieldsEntry{managed("kubectl-create", "Update", "", `{"f:metadata":{"f:labels":{".":{},"f:env":{},"f:kubernetes.io/metadata.name":{},"f:team":{}}}}`, i)}
	ns.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
	ns.Status.Phase = corev1.NamespaceActive
	return &ns
}

func managed(manager, op, sub, fields string, i int) metav1.ManagedFieldsEntry {
	t := epoch(i)
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationType(op), APIVersion: "v1", Time: &t, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields), Subresource: sub}
}

func noisyNode(n corev1.Node, i int) *corev1.Node {
	n.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}
	commonMeta(&n.ObjectMeta, "node", i)
	labels := map[string]string{"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": n.Name,
		"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m5.2xlarge"}
	for k, v := range n.Labels {
		labels[k] = v
	}
	n.Labels = labels
	n.Annotations = map[string]string{"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock"}
	n.ManagedFields = []metav1.ManagedFieldsEntry{
		managed("kubelet", "Update", "", `{"f:metadata":{"f:annotations":{".":{},"f:volumes.kubernetes.io/controller-managed-attach-detach":{}},"f:labels":{".":{},"f:beta.kubernetes.io/arch":{},"f:beta.kubernetes.io/os":{},"f:kubernetes.io/arch":{},"f:kubernetes.io/hostname":{},"f:kubernetes.io/os":{}}}}`, i),
		managed("kubelet", "Update", "status", `{"f:status":{"f:allocatable":{"f:cpu":{},"f:memory":{}},"f:conditions":{"k:{\"type\":\"Ready\"}":{"f:lastHeartbeatTime":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{}}},"f:images":{},"f:nodeInfo":{"f:containerRuntimeVersion":{},"f:kernelVersion":{}}}}`, i),
	}
	n.Spec.PodCIDR = fmt.Sprintf("10.%d.%d.0/24", 128+i/64, (i%64)*4)
	n.Spec.PodCIDRs = []string{n.Spec.PodCIDR}
	n.Spec.ProviderID = "aws:///eu-west-1a/i-" + fmt.Sprintf("%017x", i*977)
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
	q := resource.MustParse
	n.Status.Capacity = corev1.ResourceList{"cpu": q("8"), "memory": q("32211880Ki"), "pods": q("110"), "ephemeral-storage": q("101430960Ki")}
	n.Status.Allocatable = corev1.ResourceList{"cpu": q("7910m"), "memory": q("31195048Ki"), "pods": q("110"), "ephemeral-storage": q("93478772582")}
	for _, c := range []struct{ t, reason string }{{"MemoryPressure", "KubeletHasSufficientMemory"}, {"DiskPressure", "KubeletHasNoDiskPressure"}, {"PIDPressure", "KubeletHasSufficientPID"}, {"Ready", "KubeletReady"}} {
		status := corev1.ConditionFalse
		if c.t == "Ready" {
			status = corev1.ConditionTrue
		}
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeConditionType(c.t), Status: status, LastHeartbeatTime: epoch(i), LastTransitionTime: epoch(i), Reason: c.reason, Message: "kubelet is posting ready status"})
	}
	for j := range 40 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{
			fmt.Sprintf("registry.example.com/team-%02d/service-%d@sha256:%064x", j%50, j, j*104729+i),
			fmt.Sprintf("registry.example.com/team-%02d/service-%d:v1.%d.%d", j%50, j, j%10, i%10)}, SizeBytes: int64(10_000_000 + j*1_234_567)})
	}
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", i), SystemUUID: string(uid("sys", i)), BootID: string(uid("boot", i)),
		KernelVersion: "6.1.0-18-cloud-amd64", OSImage: "Debian GNU/Linux 12 (bookworm)", ContainerRuntimeVersion: "containerd://1.7.13",
		KubeletVersion: "v1.37.1", OperatingSystem: "linux", Architecture: "amd64"}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	return &n
}

func noisyPod(p corev1.Pod, i int) *corev1.Pod {
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	commonMeta(&p.ObjectMeta, "pod", i)
	hash := fmt.Sprintf("%010x", i/3*2654435761%(1<<40))[:10]
	labels := map[string]string{"pod-template-hash": hash, "app.kubernetes.io/managed-by": "helm"}
	for k, v := range p.Labels {
		labels[k] = v
	}
	p.Labels = labels
	p.GenerateName = p.Labels["app"] + "-" + hash + "-"
	p.Annotations = map[string]string{
		"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z",
		"prometheus.io/scrape":              "true",
		"prometheus.io/port":                "9090",
		"checksum/config":                   fmt.Sprintf("%064x", i*7919),
	}
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.Labels["app"] + "-" + hash, UID: uid("rs", i/3), Controller: &yes, BlockOwnerDeletion: &yes}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{
		managed("kube-controller-manager", "Update", "", `{"f:metadata":{"f:annotations":{".":{},"f:checksum/config":{},"f:kubectl.kubernetes.io/restartedAt":{},"f:prometheus.io/port":{},"f:prometheus.io/scrape":{}},"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:pod-template-hash":{},"f:tier":{},"f:version":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"`+string(uid("rs", i/3))+`\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"main\"}":{".":{},"f:env":{".":{},"k:{\"name\":\"POD_NAME\"}":{".":{},"f:name":{},"f:valueFrom":{".":{},"f:fieldRef":{}}}},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{".":{},"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{},"f:protocol":{}}},"f:resources":{".":{},"f:limits":{".":{},"f:memory":{}},"f:requests":{".":{},"f:cpu":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{}}}`, i),
		managed("kubelet", "Update", "status", `{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Initialized\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:hostIPs":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"`+p.Status.PodIP+`\"}":{".":{},"f:ip":{}}},"f:startTime":{}}}`, i),
	}
	q := resource.MustParse
	p.Spec.Containers = append([]corev1.Container(nil), p.Spec.Containers...)
	for j := range p.Spec.Containers {
		c := &p.Spec.Containers[j]
		c.Image = fmt.Sprintf("registry.example.com/team-%02d/%s:v1.%d", i%50, p.Labels["app"], i%7)
		c.ImagePullPolicy = corev1.PullIfNotPresent
		c.Env = []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}}, {Name: "LOG_LEVEL", Value: "info"}}
		c.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"memory": q("512Mi")}, Requests: corev1.ResourceList{"cpu": q("100m"), "memory": q("256Mi")}}
		c.TerminationMessagePath, c.TerminationMessagePolicy = "/dev/termination-log", corev1.TerminationMessageReadFile
		c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}, {Name: "config", MountPath: "/etc/app"}}
		c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrName(c)}}, PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3}
	}
	grace := int64(30)
	p.Spec.TerminationGracePeriodSeconds = &grace
	p.Spec.RestartPolicy, p.Spec.DNSPolicy = corev1.RestartPolicyAlways, corev1.DNSClusterFirst
	p.Spec.ServiceAccountName, p.Spec.SchedulerName = "default", "default-scheduler"
	p.Spec.SecurityContext = &corev1.PodSecurityContext{}
	p.Spec.EnableServiceLinks = &yes
	tolerate := int64(300)
	p.Spec.Tolerations = []corev1.Toleration{
		{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &tolerate},
		{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &tolerate}}
	expiry := int64(3607)
	p.Spec.Volumes = []corev1.Volume{
		{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: &expiry, Path: "token"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}}}}}},
		{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: p.Labels["app"] + "-config"}}}},
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
	p.Status.HostIP = fmt.Sprintf("172.16.%d.%d", i%4, i%250+1)
	p.Status.HostIPs = []corev1.HostIP{{IP: p.Status.HostIP}}
	p.Status.QOSClass = corev1.PodQOSBurstable
	start := epoch(i)
	p.Status.StartTime = &start
	for _, t := range []corev1.PodConditionType{"PodReadyToStartContainers", corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: epoch(i)})
	}
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Ready: true, Started: &yes, Image: c.Image,
			ImageID:     fmt.Sprintf("registry.example.com/team-%02d/%s@sha256:%064x", i%50, p.Labels["app"], i*31),
			ContainerID: fmt.Sprintf("containerd://%064x", i*131),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: epoch(i)}}})
	}
	return &p
}

// withApplied adds what `kubectl apply` and the API server put on a
// policy: the last applied configuration (the object itself, as a string)
// and managedFields.
func withApplied[T any](obj T, m *metav1.ObjectMeta, i int) T {
	applied, _ := json.Marshal(obj)
	commonMeta(m, "policy", i)
	m.Generation = 1
	m.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": string(applied) + "\n"}
	m.ManagedFields = []metav1.ManagedFieldsEntry{managed("kubectl-client-side-apply", "Update", "", `{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}}},"f:spec":{}}`, i)}
	return obj
}

// intstrName is a readiness probe's port: the container's first named
// port.
func intstrName(c *corev1.Container) intstr.IntOrString {
	if len(c.Ports) > 0 && c.Ports[0].Name != "" {
		return intstr.FromString(c.Ports[0].Name)
	}
	return intstr.FromInt32(8080)
}
