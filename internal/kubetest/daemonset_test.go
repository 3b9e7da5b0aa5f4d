package kubetest

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	agentoptions "github.com/moat-net/moat/cmd/moat-agent/app/options"
)

// agentFlags are the moat-agent flags the DaemonSet may pass (issue 4, item 1).
var agentFlags = []string{
	"--node-name", "--kubeconfig", "--metrics-bind-address", "--health-bind-address",
	"--allow-node-local", "--cut-denied-established", "--feature-gates", "--resync", "--leader-elect-candidates",
	"--metrics-secure", "--tls-cert-file", "--tls-private-key-file",
}

// TestAgentDaemonSetIsLeastPrivilege pins the properties of the agent's
// DaemonSet that a server-side dry run cannot judge: which privileges it
// has, that it runs everywhere, and that the kubelet can probe it.
func TestAgentDaemonSetIsLeastPrivilege(t *testing.T) {
	ds, err := AgentDaemonSet()
	if err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("hostNetwork is false: the agent must program the node's own nftables")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q, want system-node-critical", spec.PriorityClassName)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("tolerations %v do not tolerate every taint", spec.Tolerations)
	}
	if spec.ServiceAccountName == "" || spec.ServiceAccountName == "default" {
		t.Errorf("serviceAccountName = %q, want the agent's own", spec.ServiceAccountName)
	}
	if len(spec.Containers) != 1 || len(spec.InitContainers) != 0 {
		t.Fatalf("want exactly one container, got %d (+%d init)", len(spec.Containers), len(spec.InitContainers))
	}
	c := spec.Containers[0]

	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("container has no securityContext.capabilities")
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("privileged must be explicitly false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation must be explicitly false")
	}
	if got := sc.Capabilities.Drop; !slices.Equal(got, []corev1.Capability{"ALL"}) {
		t.Errorf("capabilities.drop = %v, want [ALL]", got)
	}
	add := slices.Clone(sc.Capabilities.Add)
	slices.Sort(add)
	// nftables and conntrack are netlink (NET_ADMIN); nothing opens a raw
	// or packet socket: the nft kernel tests and the conntrack cut
	// (internal/netns TestCutKeepsNodeConnections) pass without NET_RAW in
	// the bounding set.
	if !slices.Equal(add, []corev1.Capability{"NET_ADMIN"}) {
		t.Errorf("capabilities.add = %v, want exactly NET_ADMIN", sc.Capabilities.Add)
	}
	// One host path only: the directory of the node's lock
	// (--lock-file's default), shared by every agent on the node, so
	// that a second one (a surge pod, one started by hand) finds the
	// first one's lock.
	lockDir := filepath.Dir(agentoptions.DefaultLockFile)
	var lockVolume string
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		if v.HostPath.Path != lockDir || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
			t.Errorf("volume %s mounts host path %s: only %s (DirectoryOrCreate), the lock's, is needed", v.Name, v.HostPath.Path, lockDir)
			continue
		}
		lockVolume = v.Name
	}
	if lockVolume == "" || !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == lockVolume && m.MountPath == lockDir && !m.ReadOnly
	}) {
		t.Errorf("the host's %s is not mounted read-write at %s: agents in pods and on the host would not see each other's lock %s", lockDir, lockDir, agentoptions.DefaultLockFile)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxSurge != nil && ru.MaxSurge.String() != "0" {
		t.Errorf("maxSurge %s: two agents would program a node at once", ru.MaxSurge.String())
	}

	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}) {
		t.Error("NODE_NAME is not taken from spec.nodeName")
	}
	// The Lease Role follows kustomize's namespace override; the agent
	// must look for the Lease where it runs, not in moat-system.
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace"
	}) {
		t.Error("POD_NAMESPACE is not taken from metadata.namespace: with a namespace override the agents look for their Lease in moat-system (403)")
	}
	for _, a := range c.Args {
		name, _, _ := strings.Cut(a, "=")
		if !slices.Contains(agentFlags, name) {
			t.Errorf("argument %q is not a documented moat-agent flag %v", a, agentFlags)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resource requests %v: want cpu and memory", c.Resources.Requests)
	}

	health := flagValue(c.Args, "--health-bind-address")
	metrics := flagValue(c.Args, "--metrics-bind-address")
	for _, tc := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if tc.probe == nil || tc.probe.HTTPGet == nil || tc.probe.HTTPGet.Path != tc.path {
			t.Errorf("want an HTTP probe on %s, got %+v", tc.path, tc.probe)
			continue
		}
		if port := containerPort(c, tc.probe.HTTPGet.Port.String()); port == "" || !strings.HasSuffix(health, ":"+port) {
			t.Errorf("%s probe port %s is not --health-bind-address %q", tc.path, tc.probe.HTTPGet.Port.String(), health)
		}
	}
	if port := containerPort(c, "metrics"); port == "" || !strings.HasSuffix(metrics, ":"+port) {
		t.Errorf("metrics port %q is not --metrics-bind-address %q", port, metrics)
	}
	// hostNetwork: metrics on any but the loopback address are served on
	// the node's interfaces, so only to authorized callers.
	if host, _, _ := strings.Cut(metrics, ":"); host != "127.0.0.1" && host != "localhost" && flagValue(c.Args, "--metrics-secure") == "false" {
		t.Errorf("--metrics-bind-address=%s with --metrics-secure=false: unauthenticated metrics on the node's addresses", metrics)
	}
}

func flagValue(args []string, flag string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// containerPort resolves a named (or numeric) port of c to its number.
func containerPort(c corev1.Container, nameOrNumber string) string {
	for _, p := range c.Ports {
		if p.Name == nameOrNumber || itoa(int(p.ContainerPort)) == nameOrNumber {
			return itoa(int(p.ContainerPort))
		}
	}
	return ""
}
