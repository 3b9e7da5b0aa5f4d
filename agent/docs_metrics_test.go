package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/agent/internal/fixture"
)

// TestDocsNameRealMetrics: every moat_agent_* series the operator docs
// name (metrics table, troubleshooting, scale) is one the agent exports,
// and every series the agent exports is in docs/agent.md's table.
func TestDocsNameRealMetrics(t *testing.T) {
	a := startReady(t, clusterX(t), Config{LeaderElection: LeaderElection{Enabled: true}}, newTestDP("n1"))
	var names []string
	fixture.Eventually(t, 30*time.Second, "drop counters read", func() (bool, string) {
		fams, err := a.Metrics().Gather()
		if err != nil {
			return false, err.Error()
		}
		names = names[:0]
		for _, f := range fams {
			names = append(names, f.GetName())
		}
		return slices.Contains(names, "moat_agent_dropped_packets_total"), "no drop series yet"
	})
	exported := func(n string) bool {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(n, suffix); ok && slices.Contains(names, base) {
				return true
			}
		}
		return false
	}
	metric := regexp.MustCompile(`moat_agent_[a-z0-9_]*[a-z0-9]`)
	docs := map[string]string{}
	for _, f := range []string{"agent.md", "troubleshooting.md", "scale.md"} {
		data, err := os.ReadFile(filepath.Join("..", "docs", f))
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = string(data)
		for _, n := range metric.FindAllString(string(data), -1) {
			if !exported(n) {
				t.Errorf("docs/%s names %s, which the agent does not export", f, n)
			}
		}
	}
	// The fixed drop counters (no policy): agent.md counts them in words.
	fams, err := a.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	fixed := 0
	for _, f := range fams {
		if f.GetName() != "moat_agent_dropped_packets_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "" {
					fixed++
				}
			}
		}
	}
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
	for _, m := range regexp.MustCompile(`(\w+) fixed (?:ones|counters)`).FindAllStringSubmatch(docs["agent.md"], -1) {
		if fixed >= len(words) || m[1] != words[fixed] {
			t.Errorf("docs/agent.md: %q, but the agent exports %d fixed drop series", m[0], fixed)
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "moat_agent_") && !strings.Contains(docs["agent.md"], "`"+n+"`") {
			t.Errorf("the agent exports %s, which docs/agent.md's metrics table does not list", n)
		}
	}
}
