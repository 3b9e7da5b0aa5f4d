package matrix_test

import (
	"bytes"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/internal/clustergen"
	"github.com/moat-net/moat/internal/randcluster"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// sameOutput checks that a Matrix prints, in every format, byte for byte
// what Build's Result prints: judging each pair of classes once and
// streaming the cells changes nothing. Build judges every cell on its own
// and so is the reference.
func sameOutput(t *testing.T, name string, prog *policy.Program, opts matrix.Options) *matrix.Matrix {
	t.Helper()
	res, err := matrix.Build(prog, opts)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	m, err := matrix.New(prog, opts)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	formats := []struct {
		name string
		old  func(*bytes.Buffer) error
		new  func(*bytes.Buffer) error
	}{
		{"table", func(b *bytes.Buffer) error { return matrix.WriteTable(b, res) }, func(b *bytes.Buffer) error { return m.WriteTable(b) }},
		{"json", func(b *bytes.Buffer) error { return matrix.WriteJSON(b, res) }, func(b *bytes.Buffer) error { return m.WriteJSON(b) }},
		{"html", func(b *bytes.Buffer) error { return matrix.WriteHTML(b, res) }, func(b *bytes.Buffer) error { return m.WriteHTML(b) }},
	}
	var table bytes.Buffer
	if err := m.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	// TableSize tells the cost before it is paid: within the legend's
	// length per port.
	if est, got := m.TableSize(), int64(table.Len()); est < got-100*int64(len(m.Ports())) || est > got+100*int64(len(m.Ports())) {
		t.Errorf("%s: TableSize %d, table of %d bytes", name, est, got)
	}
	for _, f := range formats {
		var want, got bytes.Buffer
		if err := f.old(&want); err != nil {
			t.Fatalf("%s %s (Result): %v", name, f.name, err)
		}
		if err := f.new(&got); err != nil {
			t.Fatalf("%s %s (Matrix): %v", name, f.name, err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			g, w := got.String(), want.String()
			i := 0
			for i < len(g) && i < len(w) && g[i] == w[i] {
				i++
			}
			t.Errorf("%s %s: Matrix output differs from Result's at byte %d of %d/%d:\ngot:  %q\nwant: %q",
				name, f.name, i, len(g), len(w), g[max(0, i-80):min(len(g), i+80)], w[max(0, i-80):min(len(w), i+80)])
		}
	}
	return m
}

// TestMatrixMatchesBuildOnExamples: every example, with its matrix.args.
func TestMatrixMatchesBuildOnExamples(t *testing.T) {
	dirs, err := fs.Glob(examples.FS, "*/matrix.args")
	if err != nil || len(dirs) < 10 {
		t.Fatalf("found %d examples (%v)", len(dirs), err)
	}
	for _, argsFile := range dirs {
		name := filepath.Dir(argsFile)
		args, err := examples.ReadArgs(name)
		if err != nil {
			t.Fatal(err)
		}
		res, err := (&manifest.Loader{FS: examples.FS}).Load(name)
		if err != nil {
			t.Fatal(err)
		}
		prog := policy.Compile(&res.Cluster, policy.Options{IngressNetworksAndNodes: true})
		sameOutput(t, name, prog, args.Matrix)
	}
}

// TestMatrixEmpty: no endpoints is an empty table and "flows": null, as
// Build's Result prints them.
func TestMatrixEmpty(t *testing.T) {
	sameOutput(t, "empty", policy.Compile(&policy.Cluster{}, policy.Options{}), matrix.Options{Ports: []matrix.PortProto{{Port: 80, Protocol: policy.ProtoTCP}}})
}

// TestMatrixMatchesBuildOnRandomClusters: the lab's random clusters are
// small and adversarial (dual stack, host-network pods, ipBlocks with
// excepts, named ports, node peers, external peers, duplicate pod
// addresses through pod CIDRs), so classes are few pods each and every
// kind of endpoint that may not share one is there.
func TestMatrixMatchesBuildOnRandomClusters(t *testing.T) {
	shared, mixed := 0, 0
	for seed := int64(1); seed <= 24; seed++ {
		cfg := randcluster.Default()
		cfg.PodCIDRs = seed%2 == 0
		cfg.SCTP = seed%3 == 0
		sc := randcluster.Generate(seed, cfg)
		y, err := sc.Manifests()
		if err != nil {
			t.Fatal(err)
		}
		res, err := (&manifest.Loader{Stdin: strings.NewReader(string(y))}).Load("-")
		if err != nil {
			t.Fatal(err)
		}
		peers := append([]netip.Addr{}, sc.Peers...)
		for _, n := range res.Cluster.Nodes {
			peers = append(peers, n.Addrs...) // node-local traffic
		}
		for _, deny := range []bool{false, true} {
			prog := policy.Compile(&res.Cluster, policy.Options{IngressNetworksAndNodes: true, DenyNodeLocal: deny})
			opts := matrix.Options{Peers: peers, Ports: []matrix.PortProto{{Port: 80, Protocol: policy.ProtoTCP}, {Port: 53, Protocol: policy.ProtoUDP}, {Port: 8080, Protocol: policy.ProtoTCP}}}
			if deny && len(prog.Pods) > 0 {
				// -n: classes of the pods kept, policies of all.
				opts.Namespaces = []string{prog.Pods[len(prog.Pods)-1].Namespace}
			}
			m := sameOutput(t, sc.Docs[0].Name, prog, opts)
			if m.Classes() < m.Endpoints() {
				shared++
			}
			var b bytes.Buffer
			if err := m.WriteTable(&b); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(b.String(), "~ allowed over one address family") {
				mixed++
			}
		}
	}
	// The comparison means something only if classes are shared and
	// mixed cells occur.
	if shared < 10 || mixed < 5 {
		t.Errorf("%d matrices with a shared class, %d with a mixed cell: the random clusters no longer exercise them", shared, mixed)
	}
	t.Logf("%d matrices with a shared class, %d with a mixed cell", shared, mixed)
}

// TestMatrixClassesOnGeneratedCluster: a generated cluster of 150 pods
// falls into far fewer classes, and prints what Build prints.
func TestMatrixClassesOnGeneratedCluster(t *testing.T) {
	c := clustergen.Generate(clustergen.Config{Nodes: 6, Namespaces: 10, Pods: 150, NetworkPolicies: 10, ClusterPolicies: 4, Seed: 3})
	prog := policy.Compile(c.ToCluster(), policy.Options{IngressNetworksAndNodes: true})
	m := sameOutput(t, "clustergen 150", prog, matrix.Options{Peers: []netip.Addr{netip.MustParseAddr("203.0.113.9")}})
	if m.Endpoints() != 151 || m.Classes() >= m.Endpoints()/2 {
		t.Errorf("%d endpoints in %d classes, want 151 in fewer than half as many", m.Endpoints(), m.Classes())
	}
	t.Logf("%d endpoints, %d classes", m.Endpoints(), m.Classes())
}
