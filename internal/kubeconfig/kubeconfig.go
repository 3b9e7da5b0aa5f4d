// Package kubeconfig finds the API server the way kubectl does, for every
// Moat binary: an explicit --kubeconfig file, else $KUBECONFIG, else
// ~/.kube/config, with --context choosing among its contexts; and, when
// none of these exists, the in-cluster service account.
package kubeconfig

import (
	"fmt"
	"maps"
	"slices"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load returns the client configuration for path (may be empty) and
// context (empty: the file's current context). userAgent names the binary
// in the API server's logs and audit records.
func Load(path, context, userAgent string) (*rest.Config, error) {
	rules := loadingRules(path)
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		where := path
		if where == "" {
			where = "$KUBECONFIG, ~/.kube/config or the in-cluster service account"
		}
		return nil, fmt.Errorf("load kubeconfig from %s: %w", where, err)
	}
	if userAgent != "" {
		cfg.UserAgent = userAgent + " (" + rest.DefaultKubernetesUserAgent() + ")"
	}
	return cfg, nil
}

// Namespace is the namespace kubectl gives objects without one for path
// and context (as in Load): the context's namespace, else the in-cluster
// service account's, else "default".
func Namespace(path, context string) (string, error) {
	rules := loadingRules(path)
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).Namespace()
	if err != nil {
		return "", fmt.Errorf("namespace of the kubeconfig context: %w", err)
	}
	return ns, nil
}

// Contexts are the names of the contexts of the kubeconfig Load reads for
// path, sorted: what --context can name (shell completion offers them).
func Contexts(path string) ([]string, error) {
	cfg, err := loadingRules(path).Load()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return slices.Sorted(maps.Keys(cfg.Contexts)), nil
}

// loadingRules are kubectl's: path if given, else $KUBECONFIG, else
// ~/.kube/config.
func loadingRules(path string) *clientcmd.ClientConfigLoadingRules {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	return rules
}
