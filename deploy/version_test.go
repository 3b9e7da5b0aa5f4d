package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestManifestsPinTheVersion: every Moat image the manifests name, and
// every kustomize image override, carries Version as its tag, never a
// moving one such as latest.
func TestManifestsPinTheVersion(t *testing.T) {
	image := regexp.MustCompile(`image:\s*"?(ghcr\.io/moat-net/[^\s"]+)`)
	newTag := regexp.MustCompile(`newTag:\s*"?([^\s"]+)`)
	found := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") || strings.HasPrefix(p, "crds"+string(filepath.Separator)) {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range image.FindAllStringSubmatch(string(data), -1) {
			found++
			if _, tag, _ := strings.Cut(m[1], ":"); tag != Version {
				t.Errorf("%s: image %s, want the tag %s", p, m[1], Version)
			}
		}
		for _, m := range newTag.FindAllStringSubmatch(string(data), -1) {
			found++
			if m[1] != Version {
				t.Errorf("%s: newTag %s, want %s", p, m[1], Version)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 6 {
		t.Errorf("found %d image references, want the agent's, the cleanup's, the tunnel's and the kustomize overrides (6 or more)", found)
	}
}

// TestBuildScriptsReadTheVersion: hack/lib/version.sh, which gives
// hack/image/build.sh and make images their default tag, reads Version
// from this package's source, so that locally built images carry the tag
// the manifests name (they were tagged dev).
func TestBuildScriptsReadTheVersion(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	cmd := exec.Command("bash", "-c", `set -e; source hack/lib/version.sh; moat_version .`)
	cmd.Dir = ".." // the repository's root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("moat_version: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != Version {
		t.Errorf("hack/lib/version.sh reads %q, want deploy.Version %q", got, Version)
	}
}
