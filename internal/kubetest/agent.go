package kubetest

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
