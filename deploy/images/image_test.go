package images_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/kubetest"
	"github.com/moat-net/moat/internal/testenv"
)

// TestImages builds the three images the way a host without a registry
// does (hack/image/build.sh: a Debian base made with mmdebstrap, the
// repository's Dockerfile) and runs each of them.
func TestImages(t *testing.T) {
	testenv.RequirePrivileged(t)
	testenv.Require(t, missingTools())
	kubetest.RequireBinaries(t)
	root, err := kubetest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	pm := newPodman(t)
	tag := fmt.Sprintf("test-%d", os.Getpid())
	start := time.Now()
	build := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack/image/build.sh"), tag)
	build.Env = pm.env
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/image/build.sh: %v\n%s", err, out)
	}
	t.Logf("built the images in %s:\n%s", time.Since(start).Round(time.Second), lastLines(out, 6))

	images := map[string]string{}
	for _, name := range []string{"moat-agent", "moat-proxy-server", "moat-proxy-agent"} {
		ref := "localhost/" + name + ":" + tag
		if _, err := pm.run(ctx, "image", "exists", ref); err != nil {
			t.Fatalf("hack/image/build.sh did not build %s", ref)
		}
		images[name] = ref
	}

	t.Run("agent", func(t *testing.T) { testAgentImage(ctx, t, pm, images["moat-agent"]) })
	t.Run("tunnel", func(t *testing.T) {
		testTunnelImages(ctx, t, pm, images["moat-proxy-server"], images["moat-proxy-agent"])
	})
}

// missingTools names what building and running images needs beyond root,
// nft and ip; hack/test.sh installs all of it.
func missingTools() string {
	for _, tool := range []string{"podman", "runc", "mmdebstrap", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "the " + tool + " binary (hack/test.sh installs it)"
		}
	}
	return ""
}

// podman runs podman with configuration and storage private to the test:
// nothing the machine's own podman holds (images, containers, its
// containers.conf) is read or changed, and everything is removed at the
// end.
type podman struct {
	t   testing.TB
	env []string
}

// containersConf makes containers run where this suite runs (a sandbox
// whose runtime cannot set rlimits and whose cgroup layout crun refuses)
// and keeps podman's state under the test's directory. On an ordinary
// machine these settings are harmless.
const containersConf = `[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "none"
tmp_dir = "%[1]s/tmp"
volume_path = "%[1]s/volumes"

[network]
network_config_dir = "%[1]s/networks"
`

const storageConf = `[storage]
driver = "overlay"
graphroot = "%[1]s/graph"
runroot = "%[1]s/run"
`

func newPodman(t *testing.T) *podman {
	// Not t.TempDir: its cleanup would run before ours can remove the
	// storage through podman.
	dir, err := os.MkdirTemp("", "moat-image-test-")
	if err != nil {
		t.Fatal(err)
	}
	for name, tmpl := range map[string]string{"containers.conf": containersConf, "storage.conf": storageConf} {
		if err := os.WriteFile(filepath.Join(dir, name), fmt.Appendf(nil, tmpl, dir), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pm := &podman{t: t, env: append(os.Environ(),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
	)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, args := range [][]string{
			{"rm", "--all", "--force", "--time", "0"},
			{"rmi", "--all", "--force"},
		} {
			if out, err := pm.run(ctx, args...); err != nil {
				t.Errorf("cleanup: podman %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return pm
}

func (pm *podman) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = pm.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// start runs a detached container and removes it when the test ends,
// logging its output if the test failed.
func (pm *podman) start(ctx context.Context, t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := pm.run(ctx, append([]string{"run", "--detach", "--pull=never", "--name", name}, args...)...)
	if err != nil {
		t.Fatalf("podman run %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if t.Failed() {
			logs, _ := pm.run(ctx, "logs", "--tail", "40", name)
			t.Logf("container %s log tail:\n%s", name, logs)
		}
		if out, err := pm.run(ctx, "rm", "--force", "--time", "5", name); err != nil {
			t.Errorf("podman rm %s: %v\n%s", name, err, out)
		}
	})
}

// running reports whether a container is still up, with its state.
func (pm *podman) running(ctx context.Context, name string) (bool, string) {
	out, err := pm.run(ctx, "inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}}", name)
	out = strings.TrimSpace(out)
	return err == nil && strings.HasPrefix(out, "running"), out
}

// waitHTTP polls url until it answers 200 or the deadline passes; it fails
// early when the container serving it has stopped.
func waitHTTP(ctx context.Context, t *testing.T, pm *podman, container, url string, timeout time.Duration) {
	t.Helper()
	client := http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if up, state := pm.running(ctx, container); !up {
			t.Fatalf("container %s stopped (%s) before %s answered 200 (last: %s)", container, state, url, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within %s (last: %s)", url, timeout, last)
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
