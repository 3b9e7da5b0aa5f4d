package testenv

import "testing"

func TestInCI(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want bool
	}{{"", false}, {"true", true}, {"1", true}, {"false", false}, {"yes", false}} {
		t.Setenv("CI", tc.env)
		if got := InCI(); got != tc.want {
			t.Errorf("CI=%q: InCI() = %v, want %v", tc.env, got, tc.want)
		}
	}
}
