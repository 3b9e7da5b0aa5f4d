package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// unitDirectives reads a systemd unit file: section -> key -> values (a
// key given several times, or with several space-separated values,
// collects them all).
func unitDirectives(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	units := map[string]map[string][]string{}
	section := ""
	for _, line := range strings.Split(strings.ReplaceAll(string(data), "\\\n", " "), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = strings.Trim(line, "[]")
			units[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: cannot read %q", path, line)
			}
			units[section][strings.TrimSpace(k)] = append(units[section][strings.TrimSpace(k)], strings.Fields(v)...)
		}
	}
	return units
}

// TestProxyAgentUnitDoesNotBindTheKubelet: the systemd
// unit starts with and before the kubelet, but no dependency makes the
// kubelet stop, restart or fail with it.
func TestProxyAgentUnitDoesNotBindTheKubelet(t *testing.T) {
	const path = "tunnel/moat-proxy-agent.service"
	u := unitDirectives(t, path)
	for _, hard := range []struct{ section, key string }{
		{"Install", "RequiredBy"}, {"Install", "UpheldBy"},
		{"Unit", "Requires"}, {"Unit", "BindsTo"}, {"Unit", "PartOf"}, {"Unit", "Requisite"}, {"Unit", "PropagatesStopTo"}, {"Unit", "PropagatesReloadTo"},
	} {
		if vs := u[hard.section][hard.key]; slices.Contains(vs, "kubelet.service") {
			t.Errorf("%s: [%s] %s=kubelet.service: stopping or restarting the agent stops or restarts the kubelet, or a failed agent keeps it from starting", path, hard.section, hard.key)
		}
	}
	if !slices.Contains(u["Install"]["WantedBy"], "kubelet.service") {
		t.Errorf("%s: [Install] WantedBy=%v lacks kubelet.service: starting the kubelet would not start the agent", path, u["Install"]["WantedBy"])
	}
	if !slices.Contains(u["Install"]["WantedBy"], "multi-user.target") {
		t.Errorf("%s: [Install] WantedBy=%v lacks multi-user.target", path, u["Install"]["WantedBy"])
	}
	if !slices.Contains(u["Unit"]["Before"], "kubelet.service") {
		t.Errorf("%s: [Unit] Before=%v lacks kubelet.service: the kubelet may start before its way to the API server", path, u["Unit"]["Before"])
	}

	// systemd's own reading, where systemd-analyze is installed (a stand-in
	// binary, and a kubelet unit for the dependency to name).
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: the unit's syntax is not checked by systemd")
		return
	}
	dir := t.TempDir()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.ReplaceAll(string(data), "/usr/local/bin/moat-proxy-agent", "/bin/true")
	kubelet := "[Unit]\nDescription=kubelet stand-in\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"
	for name, text := range map[string]string{"moat-proxy-agent.service": unit, "kubelet.service": kubelet} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(sa, "verify", filepath.Join(dir, "moat-proxy-agent.service"), filepath.Join(dir, "kubelet.service"))
	if out, err := cmd.CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", path, err, out)
	}
}
