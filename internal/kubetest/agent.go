package kubetest

import (
	"fmt"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// AgentManifests are the agent's namespace, ServiceAccount and RBAC as
// deploy/agent ships them, for a test to apply so that the agent's requests
// are authorised exactly as in a cluster (its token from
// ServiceAccountConfig(ctx, "moat-system", "moat-agent")).
func AgentManifests() ([]*unstructured.Unstructured, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, f := range []string{"namespace.yaml", "rbac.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, "deploy", "agent", f))
		if err != nil {
			return nil, err
		}
		o, err := DecodeYAML(data)
		if err != nil {
			return nil, fmt.Errorf("deploy/agent/%s: %w", f, err)
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// AgentDaemonSet is deploy/agent/daemonset.yaml, decoded strictly (an
// unknown field is an error), for tests that check it or run the agent
// with its arguments.
func AgentDaemonSet() (*appsv1.DaemonSet, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "agent", "daemonset.yaml"))
	if err != nil {
		return nil, err
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		return nil, fmt.Errorf("deploy/agent/daemonset.yaml: %w", err)
	}
	return &ds, nil
}
