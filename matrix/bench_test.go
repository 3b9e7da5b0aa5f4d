package matrix_test

import (
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-net/moat/internal/peakheap"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// reviewCluster is the cluster of a review's adversarial input (big500.json,
// big1000.json): pods in 20 namespaces labelled team=t0..t3, pod labels
// app=a0..a49, 5 distinct container ports, and in each namespace a
// NetworkPolicy admitting its app=aN pods' ingress from team=t1
// namespaces only.
func reviewCluster(pods int) *policy.Program {
	c := &policy.Cluster{}
	for n := range 20 {
		c.Namespaces = append(c.Namespaces, policy.Namespace{Name: fmt.Sprintf("ns%d", n), Labels: map[string]string{"team": fmt.Sprintf("t%d", n%4)}})
		c.NetworkPolicies = append(c.NetworkPolicies, &policy.NetworkPolicy{Namespace: fmt.Sprintf("ns%d", n), Name: "np", Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", n)}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t1"}},
			}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		}})
	}
	c.Nodes = []policy.Node{{Name: "node-a", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.11")}}}
	for i := range pods {
		c.Pods = append(c.Pods, &policy.Pod{
			Namespace: fmt.Sprintf("ns%d", i%20), Name: fmt.Sprintf("p%d", i), NodeName: "node-a",
			Labels: map[string]string{"app": fmt.Sprintf("a%d", i%50)},
			IPs:    []netip.Addr{netip.AddrFrom4([4]byte{10, byte(1 + i/65536), byte(i / 256), byte(i)})},
			Ports:  []policy.ContainerPort{{Port: uint16(8000 + i%5), Protocol: policy.ProtoTCP}},
		})
	}
	return policy.Compile(c, policy.Options{})
}

// BenchmarkMatrix prints the matrix of the review's cluster (5 ports,
// every pod) in each format: time, bytes allocated (B/op), the peak live
// heap (peak-MB) and the output's size. json and html are measured at
// 1,000 pods only: at 10,000 the JSON alone would be ~500 GB.
//
//	go test -run '^$' -bench BenchmarkMatrix -benchtime 1x ./matrix
func BenchmarkMatrix(b *testing.B) {
	for _, pods := range []int{1000, 10000} {
		prog := reviewCluster(pods)
		for _, format := range []string{"table", "json", "html"} {
			if pods > 1000 && format != "table" {
				continue
			}
			b.Run(fmt.Sprintf("pods=%d/%s", pods, format), func(b *testing.B) {
				b.ReportAllocs()
				runtime.GC()
				stop := peakheap.Start()
				var out countWriter
				for b.Loop() {
					m, err := matrix.New(prog, matrix.Options{})
					if err != nil {
						b.Fatal(err)
					}
					switch format {
					case "table":
						err = m.WriteTable(&out)
					case "json":
						err = m.WriteJSON(&out)
					case "html":
						err = m.WriteHTML(&out)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(stop())/(1<<20), "peak-MB")
				b.ReportMetric(float64(out.n)/float64(b.N)/(1<<20), "out-MB")
			})
		}
	}
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

var _ io.Writer = (*countWriter)(nil)
