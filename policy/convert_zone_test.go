package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/policy"
)

// An IPv6 zone in an address: nftables cannot match one, and a Node
// address with a zone (the API server does not refuse it) would stop every
// node's table from being programmed once a nodes peer selects that Node.
func TestZonedAddresses(t *testing.T) {
	n, diags := policy.NodeFromAPI(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "fe80::1%eth0"},
			{Type: corev1.NodeInternalIP, Address: "192.168.1.1"},
		}},
	})
	if want := []netip.Addr{netip.MustParseAddr("192.168.1.1")}; len(n.Addrs) != 1 || n.Addrs[0] != want[0] {
		t.Errorf("node addresses %v, want %v", n.Addrs, want)
	}
	if len(diags) != 1 || diags[0].Severity != policy.SeverityWarning || diags[0].Field != "status.addresses[0].address" || !strings.Contains(diags[0].Message, "zone") {
		t.Errorf("node diagnostics %+v, want one warning at status.addresses[0].address naming the zone", diags)
	}

	p, diags := policy.PodFromAPI(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "a"},
		Status:     corev1.PodStatus{PodIP: "fd00::5", PodIPs: []corev1.PodIP{{IP: "fd00::5"}, {IP: "fe80::5%eth0"}}},
	})
	if len(p.IPs) != 1 || p.IPs[0] != netip.MustParseAddr("fd00::5") {
		t.Errorf("pod addresses %v, want [fd00::5]", p.IPs)
	}
	if len(diags) != 1 || diags[0].Severity != policy.SeverityError || diags[0].Field != "status.podIPs[1].ip" || !strings.Contains(diags[0].Message, "zone") {
		t.Errorf("pod diagnostics %+v, want one error at status.podIPs[1].ip naming the zone", diags)
	}
}
