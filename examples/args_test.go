package examples

import (
	"io/fs"
	"net/netip"
	"path"
	"strings"
	"testing"

	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		ports   []matrix.PortProto
		peers   []netip.Addr
		gates   string
		wantErr string
	}{
		{in: "--port 80/TCP --peer 203.0.113.10\n", ports: []matrix.PortProto{{Port: 80, Protocol: policy.ProtoTCP}}, peers: []netip.Addr{netip.MustParseAddr("203.0.113.10")}},
		{in: "--port=53/udp --feature-gates IngressNetworksAndNodes=true", ports: []matrix.PortProto{{Port: 53, Protocol: policy.ProtoUDP}}, gates: "IngressNetworksAndNodes=true"},
		{in: "", ports: nil},
		{in: "--port 0", wantErr: "--port"},
		{in: "--peer nope", wantErr: "--peer"},
		{in: "--feature-gates Nope=true", wantErr: "Nope"},
		{in: "--bogus 1", wantErr: "bogus"},
		{in: "--port 80 stray", wantErr: `unexpected argument "stray"`},
	} {
		a, err := ParseArgs(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if len(a.Matrix.Ports) != len(tc.ports) || len(a.Matrix.Peers) != len(tc.peers) || a.FeatureGates != tc.gates {
			t.Errorf("%q: got %+v", tc.in, a)
			continue
		}
		for i := range tc.ports {
			if a.Matrix.Ports[i] != tc.ports[i] {
				t.Errorf("%q: port %d = %v", tc.in, i, a.Matrix.Ports[i])
			}
		}
		for i := range tc.peers {
			if a.Matrix.Peers[i] != tc.peers[i] {
				t.Errorf("%q: peer %d = %v", tc.in, i, a.Matrix.Peers[i])
			}
		}
		fg, err := a.Gates()
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.gates != ""; fg.Enabled(features.IngressNetworksAndNodes) != want {
			t.Errorf("%q: gate %v, want %v", tc.in, !want, want)
		}
	}
}

// Every example's matrix.args parses.
func TestReadArgsOfEveryExample(t *testing.T) {
	files, err := fs.Glob(FS, "*/matrix.args")
	if err != nil || len(files) == 0 {
		t.Fatalf("%d files, %v", len(files), err)
	}
	for _, f := range files {
		if _, err := ReadArgs(path.Dir(f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := ReadArgs("no-such-example"); err == nil {
		t.Error("a missing example was read")
	}
}
