package clustergen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/moat-net/moat/decode"
	"github.com/moat-net/moat/policy"
)

// The JSON dump means what the generated objects mean: decoded, it
// compiles to the same statuses and verdicts as the objects converted
// directly, with no diagnostics from decoding and no object dropped.
func TestWriteJSONDecodesToTheSameCluster(t *testing.T) {
	for _, style := range []JSONStyle{Kubectl, APIServer} {
		t.Run(fmt.Sprint(style), func(t *testing.T) { checkDump(t, style) })
	}
}

func checkDump(t *testing.T, style JSONStyle) {
	g := Generate(Config{Nodes: 5, Namespaces: 20, Pods: 200, NetworkPolicies: 40, ClusterPolicies: 10, Seed: 3})
	var buf bytes.Buffer
	if err := g.WriteJSON(&buf, style); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), `"managedFields"`) != (style == APIServer) || buf.Len() < 200*3000 {
		t.Errorf("dump of %d bytes lacks the noise of real objects", buf.Len())
	}
	if !json.Valid(buf.Bytes()) {
		t.Fatal("not JSON")
	}
	var res decode.Result
	if err := res.DecodeJSON("dump", &buf); err != nil {
		t.Fatal(err)
	}
	if len(res.Dropped) > 0 || len(res.Diagnostics) > 0 || len(res.Skipped) > 0 {
		t.Fatalf("dropped %v, diagnostics %v, skipped %v", res.Dropped, res.Diagnostics, res.Skipped)
	}
	opts := policy.Options{IngressNetworksAndNodes: true}
	want, got := policy.Compile(g.ToCluster(), opts), policy.Compile(&res.Cluster, opts)
	if diff := cmp.Diff(want.Status, got.Status); diff != "" {
		t.Errorf("statuses differ (-objects +dump):\n%s", diff)
	}
	if len(got.Pods) != 200 || len(got.Nodes) != 5 {
		t.Fatalf("%d pods, %d nodes", len(got.Pods), len(got.Nodes))
	}
	for i := 0; i < len(got.Pods); i += 7 {
		for j := 0; j < len(got.Pods); j += 11 {
			for _, port := range []uint16{53, 8080, 30000} {
				f := policy.Flow{Src: policy.Endpoint{Pod: i, Addr: got.Pods[i].IPs[0]}, Dst: policy.Endpoint{Pod: j, Addr: got.Pods[j].IPs[0]}, Proto: policy.ProtoTCP, Port: port}
				if w, g := want.Evaluate(f), got.Evaluate(f); w.Allowed != g.Allowed || w.Ingress.Reason != g.Ingress.Reason || w.Egress.Reason != g.Egress.Reason {
					t.Fatalf("%s -> %s %d: objects %+v, dump %+v", got.Pods[i].Key(), got.Pods[j].Key(), port, w, g)
				}
			}
		}
	}
	if !slices.EqualFunc(want.Pods, got.Pods, func(a, b policy.Pod) bool { return a.Key() == b.Key() && slices.Equal(a.Ports, b.Ports) }) {
		t.Error("pods differ")
	}
}
