package policy_test

import (
	"strings"
	"testing"

	"github.com/moat-net/moat/policy"
)

// A bad CIDR's error says what is wrong with it in words, without the Go
// call chain netip puts before that.
func TestParseCIDRErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.0.0.300/8", `invalid CIDR "10.0.0.300/8": IPv4 field has value >255`},
		{"10.0.0.1", `invalid CIDR "10.0.0.1": no prefix length (such as /32)`},
		{" 10.0.0.0/24", `invalid CIDR " 10.0.0.0/24": unexpected character (at " 10.0.0.0")`},
		{"10.0.0.0/33", `invalid CIDR "10.0.0.0/33": prefix length out of range`},
		{"fd00::x/64", `invalid CIDR "fd00::x/64": each colon-separated field must have at least one digit (at "x")`},
		{"fe80::1%eth0/64", `invalid CIDR "fe80::1%eth0/64": IPv6 zones cannot be present in a prefix`},
	} {
		_, err := policy.ParseCIDR(tc.in)
		if err == nil || err.Error() != tc.want || strings.Contains(err.Error(), "Parse") {
			t.Errorf("ParseCIDR(%q) = %v, want %s", tc.in, err, tc.want)
		}
	}
}
