// Package kubesourcetest puts manifests into a real test API server
// (internal/kubetest) the way a cluster would hold them, statuses included,
// so tests can compare what Moat reads from the cluster with what it reads
// from the same manifests as files.
package kubesourcetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/moat-net/moat/internal/kubetest"
)

// Apply creates every object of a YAML stream with server-side apply and
// then writes what a kubelet and a node controller would: the pods' IPs
// (Running) and the nodes' addresses, from the manifests' status.
// Namespaced objects without a namespace go to "default", as with kubectl.
func Apply(ctx context.Context, env *kubetest.Env, yaml []byte) error {
	objs, err := kubetest.DecodeYAML(yaml)
	if err != nil {
		return err
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Pod", "NetworkPolicy":
			if o.GetNamespace() == "" {
				o.SetNamespace("default")
			}
		}
	}
	if err := env.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		return err
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Node":
			if err := nodeStatus(ctx, env, o); err != nil {
				return err
			}
		case "Pod":
			if err := podStatus(ctx, env, o); err != nil {
				return err
			}
		}
	}
	return nil
}

func nodeStatus(ctx context.Context, env *kubetest.Env, o *unstructured.Unstructured) error {
	addrs, found, err := unstructured.NestedSlice(o.Object, "status", "addresses")
	if err != nil || !found {
		return err
	}
	st := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": o.GetName()},
		"status":   map[string]any{"addresses": addrs},
	}}
	nodes := env.Dynamic.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"})
	force := true
	if _, err := nodes.ApplyStatus(ctx, o.GetName(), st, metav1.ApplyOptions{FieldManager: kubetest.FieldManager, Force: force}); err != nil {
		return fmt.Errorf("node %s status: %w", o.GetName(), err)
	}
	return nil
}

func podStatus(ctx context.Context, env *kubetest.Env, o *unstructured.Unstructured) error {
	var ips []string
	list, _, _ := unstructured.NestedSlice(o.Object, "status", "podIPs")
	for _, item := range list {
		if m, ok := item.(map[string]any); ok {
			if ip, ok := m["ip"].(string); ok {
				ips = append(ips, ip)
			}
		}
	}
	if len(ips) == 0 {
		if ip, _, _ := unstructured.NestedString(o.Object, "status", "podIP"); ip != "" {
			ips = []string{ip}
		}
	}
	if len(ips) == 0 {
		return nil
	}
	_, err := kubetest.SetPodIPs(ctx, env.Client, o.GetNamespace(), o.GetName(), ips...)
	return err
}

// ApplyFiles applies every file (as Apply does) in order.
func ApplyFiles(ctx context.Context, env *kubetest.Env, paths ...string) error {
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := Apply(ctx, env, data); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// WriteKubeconfig writes a kubeconfig for the environment's admin user
// with one context, named context, and returns its path.
func WriteKubeconfig(env *kubetest.Env, dir, context string) (string, error) {
	cfg := env.Config()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts[context] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "admin"}
	kc.CurrentContext = context
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", err
	}
	return path, nil
}
