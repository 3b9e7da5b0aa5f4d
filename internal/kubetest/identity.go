package kubetest

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceAccountConfig returns a client config that authenticates with a
// real token for an existing ServiceAccount, obtained through the
// TokenRequest API. Requests are then authorised exactly as for a pod
// running as that ServiceAccount, so RBAC manifests are checked for real.
func (e *Env) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	expiry := int64(3600)
	tr, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for serviceaccount %s/%s: %w", namespace, name, err)
	}
	return e.configFor(tr.Status.Token), nil
}

// WriteKubeconfig writes cfg (for example from ServiceAccountConfig) as a
// kubeconfig file at path, for processes such as moat-agent that take
// --kubeconfig. Only bearer-token configs are supported.
func (e *Env) WriteKubeconfig(path string, cfg *rest.Config) error {
	if cfg.BearerToken == "" {
		return fmt.Errorf("write kubeconfig %s: config has no bearer token", path)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: e.CAData}
	auth := &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	if cfg.Impersonate.UserName != "" {
		auth.Impersonate = cfg.Impersonate.UserName
		auth.ImpersonateGroups = cfg.Impersonate.Groups
	}
	kc.AuthInfos["kubetest"] = auth
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	kc.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}
