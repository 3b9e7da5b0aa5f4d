package lab

import (
	"context"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// TestExamplesInLab runs every example with its matrix arguments through
// the lab: real nftables, real packets, each flow compared with the
// evaluator.
func TestExamplesInLab(t *testing.T) {
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("lab examples: slow")
	}
	argFiles, err := fs.Glob(examples.FS, "*/matrix.args")
	if err != nil || len(argFiles) == 0 {
		t.Fatalf("no examples found (%v)", err)
	}
	for _, argsFile := range argFiles {
		name := filepath.Dir(argsFile)
		t.Run(name, func(t *testing.T) {
			raw, err := fs.ReadFile(examples.FS, argsFile)
			if err != nil {
				t.Fatal(err)
			}
			var ports []matrix.PortProto
			var peers []netip.Addr
			var popts policy.Options
			args := strings.Fields(string(raw))
			for i := 0; i+1 < len(args); i += 2 {
				switch args[i] {
				case "--port":
					pp, err := matrix.ParsePortProto(args[i+1])
					if err != nil {
						t.Fatal(err)
					}
					ports = append(ports, pp)
				case "--peer":
					peers = append(peers, netip.MustParseAddr(args[i+1]))
				case "--feature-gates":
					gates, err := features.New()
					if err != nil {
						t.Fatal(err)
					}
					if err := gates.Set(args[i+1]); err != nil {
						t.Fatalf("%s: %v", argsFile, err)
					}
					popts.IngressNetworksAndNodes = gates.Enabled(features.IngressNetworksAndNodes)
				default:
					t.Fatalf("%s: unknown argument %q", argsFile, args[i])
				}
			}
			res, err := (&manifest.Loader{FS: examples.FS}).Load(name)
			if err != nil {
				t.Fatal(err)
			}
			prog := policy.Compile(&res.Cluster, popts)
			prefix, err := newName()
			if err != nil {
				t.Fatal(err)
			}
			defer leftovers(t, prefix)
			rep, err := Run(context.Background(), prog, Options{Name: prefix, Peers: peers, Ports: ports}, ProbeOptions{Timeout: 600 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			measured := 0
			for _, f := range rep.Flows {
				if f.Measured {
					measured++
				}
				if !f.Agree {
					t.Errorf("disagreement: %s", describe(f))
				}
			}
			if measured == 0 {
				t.Error("no flow measured")
			}
			t.Logf("%d flows, %d measured", len(rep.Flows), measured)
		})
	}
}
