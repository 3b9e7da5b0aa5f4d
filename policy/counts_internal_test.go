package policy

import (
	"slices"
	"testing"
)

// TestCounts: a counted set reports a change only when a key joins or
// leaves it, and lists its keys sorted.
func TestCounts(t *testing.T) {
	var c counts
	for i, step := range []struct {
		key     string
		d       int
		changed bool
		keys    []string
	}{
		{"b", 1, true, []string{"b"}},
		{"a", 1, true, []string{"a", "b"}},
		{"b", 1, false, []string{"a", "b"}},
		{"b", -1, false, []string{"a", "b"}},
		{"c", -1, false, []string{"a", "b"}}, // unknown key, removed: nothing
		{"b", -1, true, []string{"a"}},
		{"a", -2, true, nil},
		{"a", 0, false, nil},
	} {
		if got := c.add(step.key, step.d); got != step.changed {
			t.Errorf("step %d: add(%q, %d) = %v, want %v", i, step.key, step.d, got, step.changed)
		}
		if got := c.keys(); !slices.Equal(got, step.keys) && !(len(got) == 0 && len(step.keys) == 0) {
			t.Errorf("step %d: keys %v, want %v", i, got, step.keys)
		}
	}
}
