package kubetest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRequiredVersion(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, gomod, module, want string
	}{
		{"single line", "module x\n\nrequire k8s.io/kubernetes v1.37.1\n", "k8s.io/kubernetes", "v1.37.1"},
		{"block", "module x\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.7.3\n\tk8s.io/kubernetes v1.2.3 // indirect\n)\n", "k8s.io/kubernetes", "v1.2.3"},
		{"replace only", "module x\n\nreplace k8s.io/kubernetes => k8s.io/kubernetes v1.0.0\n", "k8s.io/kubernetes", ""},
		{"absent", "module x\n", "k8s.io/kubernetes", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".mod")
			if err := os.WriteFile(p, []byte(tc.gomod), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := requiredVersion(p, tc.module)
			if tc.want == "" {
				if err == nil {
					t.Errorf("got %q, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestRepoVersionsArePinned(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kube, etcd, err := Versions(root)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(kube, "v1.") || !strings.HasPrefix(etcd, "v3.") {
		t.Errorf("versions %s, %s: want a v1.x kube-apiserver and a v3.x etcd", kube, etcd)
	}
}

func TestFindBinariesHonoursOverrides(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "exe")
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("both set", func(t *testing.T) {
		t.Setenv(EnvAPIServer, exe)
		t.Setenv(EnvEtcd, exe)
		b, err := FindBinaries()
		if err != nil || b.APIServer != exe || b.Etcd != exe {
			t.Errorf("got %+v, %v; want both %s", b, err, exe)
		}
	})
	t.Run("not executable", func(t *testing.T) {
		t.Setenv(EnvAPIServer, plain)
		t.Setenv(EnvEtcd, exe)
		_, err := FindBinaries()
		if err == nil || !strings.Contains(err.Error(), EnvAPIServer) {
			t.Errorf("got %v; want an error naming %s", err, EnvAPIServer)
		}
	})
	t.Run("missing everywhere", func(t *testing.T) {
		// An override that does not exist is a configuration error, not "missing".
		t.Setenv(EnvAPIServer, filepath.Join(dir, "nope"))
		_, err := FindBinaries()
		if err == nil || errors.Is(err, ErrBinariesMissing) {
			t.Errorf("got %v; want a non-skippable error for a bad override", err)
		}
	})
	t.Run("search order", func(t *testing.T) {
		t.Setenv(EnvAPIServer, "")
		t.Setenv(EnvEtcd, "")
		root, cache := t.TempDir(), t.TempDir()
		for mod, line := range map[string]string{
			"apiserver": "require k8s.io/kubernetes v1.99.0",
			"etcd":      "require go.etcd.io/etcd/server/v3 v3.99.0",
		} {
			writeFile(t, filepath.Join(root, "hack/kube", mod, "go.mod"), "module x\n\n"+line+"\n", 0o644)
		}
		_, err := findBinaries(root, cache)
		if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "hack/kube/build.sh") {
			t.Fatalf("empty: got %v; want ErrBinariesMissing telling to run hack/kube/build.sh", err)
		}
		cachedAPI := filepath.Join(cache, "kube-apiserver-v1.99.0", "kube-apiserver")
		cachedEtcd := filepath.Join(cache, "etcd-v3.99.0", "etcd")
		writeFile(t, cachedAPI, "", 0o755)
		writeFile(t, cachedEtcd, "", 0o755)
		if b, err := findBinaries(root, cache); err != nil || b.APIServer != cachedAPI || b.Etcd != cachedEtcd {
			t.Errorf("cache only: got %+v, %v; want the cached binaries", b, err)
		}
		binAPI := filepath.Join(root, "bin", "kube-apiserver")
		writeFile(t, binAPI, "", 0o755)
		if b, err := findBinaries(root, cache); err != nil || b.APIServer != binAPI || b.Etcd != cachedEtcd {
			t.Errorf("bin and cache: got %+v, %v; want bin/ first", b, err)
		}
		t.Setenv(EnvEtcd, exe)
		if b, err := findBinaries(root, cache); err != nil || b.Etcd != exe {
			t.Errorf("override: got %+v, %v; want %s", b, err, exe)
		}
	})
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func TestWriteTokenFile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		users []User
		ok    bool
	}{
		{"defaults", defaultOptions().users, true},
		{"comma in name", []User{{Name: "a,b"}}, false},
		{"quote in group", []User{{Name: "a", Groups: []string{`g"`}}}, false},
		{"empty name", []User{{Name: ""}}, false},
		{"duplicate", []User{{Name: "a"}, {Name: "a"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			tokens, err := writeTokenFile(p, tc.users)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				return
			}
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			want := tokens[AdminUser] + "," + AdminUser + "," + AdminUser + `,"system:masters"`
			if !strings.Contains(string(data), want+"\n") {
				t.Errorf("token file %q lacks the admin line %q", data, want)
			}
			if tokens[AdminUser] == tokens[UnprivilegedUser] || len(tokens[AdminUser]) < 32 {
				t.Errorf("tokens not distinct and random: %v", tokens)
			}
		})
	}
}

func TestDecodeYAML(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		kinds []string
		ok    bool
	}{
		{"two docs and empties", "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\n# comment only\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: b\n  namespace: a\n", []string{"Namespace", "ServiceAccount"}, true},
		{"no kind", "apiVersion: v1\nmetadata:\n  name: a\n", nil, false},
		{"not yaml", "a: [\n", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := DecodeYAML([]byte(tc.in))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
			}
			if strings.Join(kinds, ",") != strings.Join(tc.kinds, ",") {
				t.Errorf("kinds = %v, want %v", kinds, tc.kinds)
			}
		})
	}
}

// TestAgentManifests: what tests apply for the agent holds its namespace
// and the ServiceAccount whose token they then use.
func TestAgentManifests(t *testing.T) {
	objs, err := AgentManifests()
	if err != nil {
		t.Fatal(err)
	}
	has := map[string]bool{}
	for _, o := range objs {
		has[o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = true
	}
	for _, want := range []string{"Namespace /moat-system", "ServiceAccount moat-system/moat-agent"} {
		if !has[want] {
			t.Errorf("no %s in %v", want, has)
		}
	}
}
