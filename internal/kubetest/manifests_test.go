package kubetest

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// Which files under deploy/ are checked, and how (the rule is explicit so
// that nothing is skipped silently):
//
//   - Only *.yaml and *.yml files are manifests. Anything else (Dockerfile,
//     systemd units, *.conf, *.md) is listed in the test log as not YAML.
//   - kustomize's own files are recognised by name, as kustomize does
//     (kustomizeFiles): they are checked for dangling references, not applied.
//   - Every document of every other YAML file must have apiVersion and kind.
//     A document whose group is not served by an API server (notServed:
//     kustomize inputs, component configuration such as kube-apiserver's
//     EgressSelectorConfiguration, kubeconfig files) is logged and skipped.
//   - Everything else is sent to the real API server: CRDs and Namespaces for
//     real (other objects depend on them), the rest with server-side apply
//     in dry-run mode and strict field validation.
var kustomizeFiles = append(slices.Clone(kustomizationNames), "kustomizeconfig.yaml")

// kustomizationNames are the names kustomize looks for in a directory.
var kustomizationNames = []string{"kustomization.yaml", "kustomization.yml", "Kustomization"}

// notServed says why a document with this apiVersion and kind is not an
// object of the Kubernetes API (and so is not applied), or "" when it is one.
func notServed(apiVersion, kind string) string {
	group, _, found := strings.Cut(apiVersion, "/")
	if !found {
		group = ""
	}
	switch {
	case group == "kustomize.config.k8s.io":
		return "kustomize input"
	case group == "apiserver.k8s.io" || strings.HasSuffix(group, ".config.k8s.io"):
		return "component configuration file read from disk (" + apiVersion + " " + kind + ")"
	case apiVersion == "v1" && kind == "Config":
		return "kubeconfig file"
	}
	return ""
}

func TestNotServedRule(t *testing.T) {
	for _, tc := range []struct {
		apiVersion, kind string
		skip             bool
	}{
		{"apiserver.k8s.io/v1beta1", "EgressSelectorConfiguration", true},
		{"apiserver.config.k8s.io/v1", "AdmissionConfiguration", true},
		{"kubelet.config.k8s.io/v1beta1", "KubeletConfiguration", true},
		{"kustomize.config.k8s.io/v1beta1", "Kustomization", true},
		{"v1", "Config", true},
		{"v1", "ConfigMap", false},
		{"apps/v1", "DaemonSet", false},
		{"policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicy", false},
		{"apiextensions.k8s.io/v1", "CustomResourceDefinition", false},
	} {
		if got := notServed(tc.apiVersion, tc.kind) != ""; got != tc.skip {
			t.Errorf("notServed(%s, %s) skips=%v, want %v", tc.apiVersion, tc.kind, got, tc.skip)
		}
	}
}

// manifest is one API object from a file under deploy/.
type manifest struct {
	file string // relative to the repository root
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	return m.file + ":" + m.obj.GetKind() + "/" + m.obj.GetName()
}

// deployTree lists deploy/: API objects to apply, and kustomization files.
func deployTree(t *testing.T) (root string, objs []manifest, kustomizations []string) {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	deploy := filepath.Join(root, "deploy")
	err = filepath.WalkDir(deploy, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		name := d.Name()
		switch {
		case slices.Contains(kustomizationNames, name):
			kustomizations = append(kustomizations, path)
			return nil
		case slices.Contains(kustomizeFiles, name):
			t.Logf("kustomize configuration, not applied: %s", rel)
			return nil
		case !strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml"):
			t.Logf("not YAML, not applied: %s", rel)
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		docs, err := DecodeYAML(data)
		if err != nil {
			t.Errorf("%s: %v (every YAML document under deploy/ needs apiVersion and kind)", rel, err)
			return nil
		}
		for _, o := range docs {
			if why := notServed(o.GetAPIVersion(), o.GetKind()); why != "" {
				t.Logf("not an API object, not applied: %s %s %q: %s", rel, o.GetKind(), o.GetName(), why)
				continue
			}
			objs = append(objs, manifest{file: rel, obj: o})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", deploy, err)
	}
	return root, objs, kustomizations
}

// kustomization holds the fields of a kustomization that name local files.
type kustomization struct {
	Resources             []string `json:"resources"`
	Components            []string `json:"components"`
	Crds                  []string `json:"crds"`
	Configurations        []string `json:"configurations"`
	PatchesStrategicMerge []string `json:"patchesStrategicMerge"`
	Patches               []struct {
		Path string `json:"path"`
	} `json:"patches"`
}

func (k kustomization) references() []string {
	refs := slices.Concat(k.Resources, k.Components, k.Crds, k.Configurations, k.PatchesStrategicMerge)
	for _, p := range k.Patches {
		if p.Path != "" {
			refs = append(refs, p.Path)
		}
	}
	return refs
}

// TestDeployKustomizationsResolve checks, without a server, that every
// kustomization under deploy/ references files that exist (a directory must
// hold a kustomization) and that every API object file next to a
// kustomization is referenced by it, so `kubectl apply -k` deploys all of it.
func TestDeployKustomizationsResolve(t *testing.T) {
	root, objs, kustomizations := deployTree(t)
	if !slices.Contains(kustomizations, filepath.Join(root, "deploy", "kustomization.yaml")) {
		t.Error("deploy/kustomization.yaml is missing")
	}
	for _, kf := range kustomizations {
		rel, _ := filepath.Rel(root, kf)
		data, err := os.ReadFile(kf)
		if err != nil {
			t.Fatal(err)
		}
		var k kustomization
		if err := yaml.Unmarshal(data, &k); err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		dir := filepath.Dir(kf)
		referenced := map[string]bool{}
		for _, ref := range k.references() {
			if strings.Contains(ref, "://") || strings.HasPrefix(ref, "github.com/") {
				t.Logf("%s: remote reference %s not checked", rel, ref)
				continue
			}
			p := filepath.Join(dir, ref)
			referenced[p] = true
			st, err := os.Stat(p)
			switch {
			case err != nil:
				t.Errorf("%s references %s: %v", rel, ref, err)
			case st.IsDir() && !slices.ContainsFunc(kustomizationNames, func(n string) bool {
				_, err := os.Stat(filepath.Join(p, n))
				return err == nil
			}):
				t.Errorf("%s references directory %s, which has no kustomization.yaml", rel, ref)
			}
		}
		for _, m := range objs {
			abs := filepath.Join(root, m.file)
			if filepath.Dir(abs) == dir && !referenced[abs] {
				t.Errorf("%s does not reference %s, which holds %s", rel, filepath.Base(abs), m)
			}
		}
	}
}

// TestDeployManifestsApply sends every manifest under deploy/ to a real API
// server, then checks the agent's RBAC as the agent's own ServiceAccount.
func TestDeployManifestsApply(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	env := Start(ctx, t)
	_, objs, _ := deployTree(t)
	if len(objs) == 0 {
		t.Fatal("no API objects under deploy/")
	}

	var crds [][]byte
	var namespaces, rest []manifest
	for _, m := range objs {
		switch m.obj.GroupVersionKind().GroupKind().String() {
		case "CustomResourceDefinition.apiextensions.k8s.io":
			data, err := json.Marshal(m.obj.Object)
			if err != nil {
				t.Fatal(err)
			}
			crds = append(crds, data)
		case "Namespace":
			namespaces = append(namespaces, m)
		default:
			rest = append(rest, m)
		}
	}
	if len(crds) == 0 {
		t.Error("deploy/ ships no CustomResourceDefinition (expected the ClusterNetworkPolicy CRDs under deploy/crds)")
	} else if err := env.InstallCRDs(ctx, crds...); err != nil {
		t.Fatalf("CRDs from deploy/: %v", err)
	}
	for _, m := range namespaces {
		if err := env.Apply(ctx, []*unstructured.Unstructured{m.obj}, ApplyOptions{}); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].String() < rest[j].String() })
	for _, m := range rest {
		if err := env.Apply(ctx, []*unstructured.Unstructured{m.obj}, ApplyOptions{DryRun: true}); err != nil {
			t.Errorf("%s (server-side dry run): %v", m, err)
		} else {
			t.Logf("applied (dry run): %s", m)
		}
	}
	if t.Failed() {
		return
	}
	checkAgentRBAC(ctx, t, env, objs)
}

// checkAgentRBAC applies the agent's RBAC for real and asks the API server
// what the DaemonSet's ServiceAccount may do, through SubjectAccessReviews
// and through real requests with a token of that ServiceAccount.
func checkAgentRBAC(ctx context.Context, t *testing.T, env *Env, objs []manifest) {
	var ds *unstructured.Unstructured
	var rbac []*unstructured.Unstructured
	for _, m := range objs {
		switch m.obj.GetKind() {
		case "DaemonSet":
			if m.obj.GetName() == "moat-agent" {
				ds = m.obj
			}
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			rbac = append(rbac, m.obj)
		}
	}
	if ds == nil {
		t.Fatal("no moat-agent DaemonSet under deploy/")
	}
	ns := ds.GetNamespace()
	sa, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "serviceAccountName")
	if sa == "" || sa == "default" {
		t.Fatalf("DaemonSet %s/moat-agent runs as ServiceAccount %q; want its own", ns, sa)
	}
	if err := env.Apply(ctx, rbac, ApplyOptions{}); err != nil {
		t.Fatalf("apply agent RBAC: %v", err)
	}

	user := "system:serviceaccount:" + ns + ":" + sa
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	const cnp = "clusternetworkpolicies"
	const cnpGroup = "policy.networking.k8s.io"
	for _, tc := range []struct {
		verb, group, resource, sub, namespace string
		allowed                               bool
	}{
		{"list", "", "pods", "", "", true},
		{"watch", "", "pods", "", "", true},
		{"get", "", "nodes", "", "", true},
		{"watch", "", "namespaces", "", "", true},
		{"list", "networking.k8s.io", "networkpolicies", "", "", true},
		{"watch", cnpGroup, cnp, "", "", true},
		{"update", cnpGroup, cnp, "status", "", true},
		{"patch", cnpGroup, cnp, "status", "", true},
		{"create", "", "events", "", "default", true},
		{"create", "events.k8s.io", "events", "", "default", true},
		// A new status writer lists the PolicyProblem Events already sent.
		{"list", "", "events", "", "", true},
		// The secure metrics endpoint reviews its callers (F15).
		{"create", "authentication.k8s.io", "tokenreviews", "", "", true},
		{"create", "authorization.k8s.io", "subjectaccessreviews", "", "", true},
		{"update", "coordination.k8s.io", "leases", "", ns, true},
		{"create", "coordination.k8s.io", "leases", "", ns, true},

		{"update", "coordination.k8s.io", "leases", "", "kube-system", false},
		{"list", "", "secrets", "", "", false},
		{"get", "", "secrets", "", ns, false},
		{"list", "", "configmaps", "", "", false},
		{"update", cnpGroup, cnp, "", "", false},
		{"create", cnpGroup, cnp, "", "", false},
		{"delete", cnpGroup, cnp, "", "", false},
		{"update", "", "pods", "", "default", false},
		{"update", "", "pods", "status", "default", false},
		{"patch", "", "nodes", "", "", false},
		{"update", "networking.k8s.io", "networkpolicies", "", "default", false},
		{"delete", "", "events", "", "default", false},
		{"create", "", "pods", "exec", "default", false},
		{"impersonate", "", "users", "", "", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: tc.verb, Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Namespace: tc.namespace,
			},
		}}
		got, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SubjectAccessReview: %v", err)
		}
		if got.Status.Allowed != tc.allowed {
			t.Errorf("%s may %s %s/%s/%s in %q: allowed=%v, want %v (%s)", user, tc.verb, tc.group, tc.resource, tc.sub, tc.namespace, got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}

	// The same through real requests with a real token of the ServiceAccount,
	// read from a kubeconfig file as moat-agent --kubeconfig would.
	cfg, err := env.ServiceAccountConfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		t.Fatal(err)
	}
	agent, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("agent token: list pods: %v", err)
	}
	if _, err := agent.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("agent token: list nodes: %v", err)
	}
	if _, err := agent.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent token: list secrets: %v, want Forbidden", err)
	}
	if _, err := agent.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("agent token: list secrets in %s: %v, want Forbidden", ns, err)
	}
}
