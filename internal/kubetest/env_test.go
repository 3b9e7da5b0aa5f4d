package kubetest

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestLaunchServesAndStopLeavesNothing(t *testing.T) {
	bins := RequireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Another loopback address (all of 127/8 is local on Linux) exercises
	// WithBindAddress and the serving certificate's SAN for it; the client
	// verifies the certificate against the generated CA.
	bind := netip.MustParseAddr("127.0.0.2")
	env, err := Launch(ctx, bins, WithBindAddress(bind))
	if err != nil {
		t.Fatal(err)
	}
	if u, err := url.Parse(env.URL); err != nil || u.Hostname() != bind.String() {
		t.Errorf("URL %s (%v): want host %s", env.URL, err, bind)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = env.Stop()
		}
	}()

	body, err := env.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil || string(body) != "ok" {
		t.Fatalf("/readyz = %q, %v; want ok", body, err)
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	wantVersion, _, err := Versions(root)
	if err != nil {
		t.Fatal(err)
	}
	v, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != wantVersion {
		t.Errorf("server reports %s, want %s (the version ldflags of hack/kube/build.sh)", v.GitVersion, wantVersion)
	}

	pids := []int{env.apiServer.proc.cmd.Process.Pid, env.etcd.proc.cmd.Process.Pid}
	dir := env.Dir
	if err := env.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	for _, pid := range pids {
		// Reaped children no longer exist; a leaked group would still answer.
		if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process group %d still exists after Stop (kill 0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Stop (stat: %v)", dir, err)
	}
	if err := env.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestPodStatusThroughSubresource(t *testing.T) {
	env := sharedEnv(t)
	ctx := t.Context()
	c := env.Client

	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: "pods-test", Labels: map[string]string{"team": "a"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.0.2.10"},
		{Type: corev1.NodeInternalIP, Address: "192.0.2.11"}, // second of a family: not a host IP
		{Type: corev1.NodeInternalIP, Address: "2001:db8::10"},
	}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "pods-test", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{
			NodeName:   "node-a",
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/web:1"}},
		},
	}
	if _, err := c.CoreV1().Pods("pods-test").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	if _, err := SetPodIPs(ctx, c, "pods-test", "web", "10.244.1.5", "fd00:10:244:1::5"); err != nil {
		t.Fatal(err)
	}
	got, err := c.CoreV1().Pods("pods-test").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.PodIP != "10.244.1.5" || len(got.Status.PodIPs) != 2 || got.Status.PodIPs[1].IP != "fd00:10:244:1::5" {
		t.Errorf("pod IPs = %q %v, want 10.244.1.5 and fd00:10:244:1::5", got.Status.PodIP, got.Status.PodIPs)
	}
	if got.Status.HostIP != "192.0.2.10" || len(got.Status.HostIPs) != 2 {
		t.Errorf("host IPs = %q %v, want 192.0.2.10 and 2001:db8::10", got.Status.HostIP, got.Status.HostIPs)
	}
	if got.Status.Phase != corev1.PodRunning {
		t.Errorf("phase = %s, want Running", got.Status.Phase)
	}

	// Writing it again (a pod restarted elsewhere) replaces the address.
	if _, err := SetPodIPs(ctx, c, "pods-test", "web", "10.244.1.6"); err != nil {
		t.Fatal(err)
	}
	got, err = c.CoreV1().Pods("pods-test").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.PodIP != "10.244.1.6" || len(got.Status.PodIPs) != 1 {
		t.Errorf("after second write pod IPs = %q %v, want only 10.244.1.6", got.Status.PodIP, got.Status.PodIPs)
	}
}

func TestSetPodIPsRejectsBadAddresses(t *testing.T) {
	for _, tc := range []struct {
		name string
		ips  []string
	}{
		{"none", nil},
		{"three", []string{"10.0.0.1", "fd00::1", "10.0.0.2"}},
		{"garbage", []string{"10.0.0.300"}},
		{"same family", []string{"10.0.0.1", "10.0.0.2"}},
		{"zone", []string{"fe80::1%eth0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Validation happens before any request: a nil client would panic if not.
			if _, err := SetPodIPs(context.Background(), nil, "ns", "pod", tc.ips...); err == nil {
				t.Errorf("SetPodIPs(%q) succeeded, want an error", tc.ips)
			}
		})
	}
}

func TestRestartAPIServerKeepsState(t *testing.T) {
	env := sharedEnv(t)
	ctx := t.Context()
	if _, err := env.Client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "survives-restart"},
		Data:       map[string]string{"k": "v"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Client.CoreV1().ConfigMaps("default").Get(ctx, "survives-restart", metav1.GetOptions{}); err == nil {
		t.Fatal("request succeeded while kube-apiserver was stopped")
	}
	if err := env.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	cm, err := env.Client.CoreV1().ConfigMaps("default").Get(ctx, "survives-restart", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if cm.Data["k"] != "v" {
		t.Errorf("after restart data = %v, want k=v", cm.Data)
	}
}
