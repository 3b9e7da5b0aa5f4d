package lab

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

const (
	clientIP4 = "10.50.1.10"
	clientIP6 = "fd50:1::10"
	localIP4  = "10.50.1.11"
	serverIP4 = "10.50.2.10"
	serverIP6 = "fd50:2::10"
	otherIP4  = "10.50.2.11"
	nodeA4    = "192.168.50.1"
	nodeB4    = "192.168.50.2"
)

// behaviour compiles testdata/behaviour.yaml plus extra documents.
func behaviour(t testing.TB, extra string, opts policy.Options) *policy.Program {
	t.Helper()
	y := mustRead(t, "testdata/behaviour.yaml")
	if extra != "" {
		y += "\n---\n" + extra
	}
	return compileBytes(t, []byte(y), opts)
}

func mustRead(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// upLab starts a lab that is torn down when the test ends.
func upLab(t *testing.T, prog *policy.Program, opts Options) *Lab {
	t.Helper()
	testenv.RequirePrivileged(t)
	if testing.Short() {
		t.Skip("lab test: slow")
	}
	if opts.Name == "" {
		var err error
		if opts.Name, err = newName(); err != nil {
			t.Fatal(err)
		}
	}
	l, err := Up(context.Background(), prog, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		leftovers(t, opts.Name)
	})
	return l
}

func (l *Lab) probe(t *testing.T, src, dst string, proto policy.Protocol, port uint16, timeout time.Duration) outcome {
	t.Helper()
	o, err := l.probeErr(src, dst, proto, port, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// probeErr is probe for goroutines other than the test's.
func (l *Lab) probeErr(src, dst string, proto policy.Protocol, port uint16, timeout time.Duration) (outcome, error) {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	place, ok := l.st.Topology.Locate(s)
	if !ok {
		return failed, fmt.Errorf("%s is not in the lab", src)
	}
	r := (&prober{ns: l.ns}).one(context.Background(), probeSpec{SrcNS: place.NS, Src: s, Dst: d, Proto: proto, Port: port}, timeout)
	if r.Outcome == failed {
		return failed, fmt.Errorf("probe %s: %w", r.Probe, r.Err)
	}
	return r.Outcome, nil
}

// echoServer answers lines on addr inside its namespace until the test
// ends.
func echoServer(t *testing.T, l *Lab, addr string) {
	t.Helper()
	ap := netip.MustParseAddrPort(addr)
	place, _ := l.st.Topology.Locate(ap.Addr())
	h, err := l.ns.Get(place.NS)
	if err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := h.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", ap.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintln(c, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// dial opens a TCP connection from src (inside its namespace) to dst.
func dial(t *testing.T, l *Lab, src, dst string) net.Conn {
	t.Helper()
	s := netip.MustParseAddr(src)
	place, _ := l.st.Topology.Locate(s)
	h, err := l.ns.Get(place.NS)
	if err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	if err := h.Do(func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(s, 0)), Timeout: 2 * time.Second}
		var err error
		c, err = d.Dial("tcp", dst)
		return err
	}); err != nil {
		t.Fatalf("dial %s -> %s: %v", src, dst, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a line and waits up to d for it to come back.
func roundTrip(c net.Conn, msg string, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintln(c, msg); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != msg {
		return fmt.Errorf("echo %q, want %q", line, msg)
	}
	return nil
}

const isolateServer = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-other, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: other}}}]
`

const isolateOther = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: other-closed, namespace: app}
spec:
  podSelector: {matchLabels: {role: other}}
  policyTypes: [Ingress]
`

func TestEstablishedSurvivesUnrelatedUpdateAndIsCutByDeny(t *testing.T) {
	for _, cut := range []bool{true, false} {
		t.Run(fmt.Sprintf("CutDenied=%v", cut), func(t *testing.T) {
			l := upLab(t, behaviour(t, "", policy.Options{}), Options{CutDenied: cut})
			ctx := context.Background()
			echoServer(t, l, serverIP4+":7001")
			c := dial(t, l, clientIP4, serverIP4+":7001")
			if err := roundTrip(c, "before", 2*time.Second); err != nil {
				t.Fatalf("no echo before any update: %v", err)
			}
			if _, err := l.Apply(ctx, behaviour(t, isolateOther, policy.Options{}), nil); err != nil {
				t.Fatal(err)
			}
			if err := roundTrip(c, "unrelated", 2*time.Second); err != nil {
				t.Fatalf("unrelated update broke an allowed connection: %v", err)
			}
			res, err := l.Apply(ctx, behaviour(t, isolateOther+"---\n"+isolateServer, policy.Options{}), nil)
			if err != nil {
				t.Fatal(err)
			}
			cutAt := time.Now()
			err = roundTrip(c, "after", time.Second)
			if cut {
				if err == nil {
					t.Fatalf("established connection still works after a denying update (results %+v)", res)
				}
				if time.Since(cutAt) > 1500*time.Millisecond {
					t.Errorf("cutting took %v", time.Since(cutAt))
				}
				deleted := 0
				for _, r := range res {
					deleted += r.ConntrackDeleted
				}
				if deleted == 0 {
					t.Error("no conntrack entry was removed")
				}
			} else if err != nil {
				t.Fatalf("without CutDenied the established connection should live on: %v", err)
			}
			// New connections are denied either way.
			if o := l.probe(t, clientIP4, serverIP4, policy.ProtoTCP, 80, 500*time.Millisecond); o.Reached() {
				t.Errorf("new connection after the deny: %v", o)
			}
		})
	}
}

func TestDeniedTCPTimesOutWithoutReset(t *testing.T) {
	l := upLab(t, behaviour(t, isolateServer, policy.Options{}), Options{})
	if o := l.probe(t, clientIP4, serverIP4, policy.ProtoTCP, 80, 700*time.Millisecond); o != timedOut {
		t.Errorf("denied TCP: %v, want a timeout (drop, not reject)", o)
	}
	if o := l.probe(t, clientIP4, serverIP4, policy.ProtoUDP, 53, 700*time.Millisecond); o != timedOut {
		t.Errorf("denied UDP: %v, want a timeout", o)
	}
	if o := l.probe(t, otherIP4, serverIP4, policy.ProtoTCP, 80, 2*time.Second); o != reached {
		t.Errorf("allowed TCP: %v", o)
	}
}

const isolateLocal = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: local-closed, namespace: app}
spec:
  podSelector: {matchLabels: {role: local}}
  policyTypes: [Ingress]
`

func TestNodeLocalTraffic(t *testing.T) {
	for _, deny := range []bool{false, true} {
		t.Run(fmt.Sprintf("DenyNodeLocal=%v", deny), func(t *testing.T) {
			opts := policy.Options{DenyNodeLocal: deny}
			prog := behaviour(t, isolateLocal, opts)
			l := upLab(t, prog, Options{})
			for _, tc := range []struct {
				src  string
				want bool
			}{
				{nodeA4, !deny}, // the pod's own node: kubelet probes
				{nodeB4, false}, // another node is not node-local
				{clientIP4, false},
			} {
				o := l.probe(t, tc.src, localIP4, policy.ProtoTCP, 80, time.Second)
				if o.Reached() != tc.want {
					t.Errorf("%s -> local:80: %v, want reached=%v", tc.src, o, tc.want)
				}
				v := evaluate(t, prog, tc.src, localIP4, policy.ProtoTCP, 80)
				if v != tc.want {
					t.Errorf("evaluator says %v for %s -> local:80", v, tc.src)
				}
			}
		})
	}
}

// evaluate asks the evaluator about one flow between addresses.
func evaluate(t *testing.T, prog *policy.Program, src, dst string, proto policy.Protocol, port uint16) bool {
	t.Helper()
	s, err := prog.ParseEndpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	d, err := prog.ParseEndpoint(dst)
	if err != nil {
		t.Fatal(err)
	}
	return prog.Evaluate(policy.Flow{Src: s, Dst: d, Proto: proto, Port: port}).Allowed
}

const denyClientV6 = `apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: no-v6-clients}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: server}}}}
  ingress:
  - action: Deny
    from: [{networks: ["fd50:1::/64"]}]
`

func TestDualStack(t *testing.T) {
	prog := behaviour(t, denyClientV6, policy.Options{IngressNetworksAndNodes: true})
	l := upLab(t, prog, Options{})
	for _, tc := range []struct {
		src, dst string
		want     bool
	}{
		{clientIP4, serverIP4, true},
		{clientIP6, serverIP6, false},
		{"fd50:2::11", serverIP6, true},
		{clientIP6, "fd50:2::11", true},
	} {
		for _, proto := range []policy.Protocol{policy.ProtoTCP, policy.ProtoUDP} {
			port := uint16(80)
			if proto == policy.ProtoUDP {
				port = 53
			}
			if tc.dst != serverIP6 && tc.dst != serverIP4 && proto == policy.ProtoUDP {
				continue
			}
			o := l.probe(t, tc.src, tc.dst, proto, port, time.Second)
			if o.Reached() != tc.want {
				t.Errorf("%s -> %s %d/%s: %v, want reached=%v", tc.src, tc.dst, port, proto, o, tc.want)
			}
			if v := evaluate(t, prog, tc.src, tc.dst, proto, port); v != tc.want {
				t.Errorf("evaluator: %s -> %s %d/%s = %v", tc.src, tc.dst, port, proto, v)
			}
		}
	}
}

const serverFromClient80 = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-in, namespace: app}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{port: 80}]
`

// TestProbesDuringUpdates: while 100 policy updates (each changing rules
// for another pod) are applied, flows whose verdict never changes are
// probed continuously and must never show a wrong verdict.
func TestProbesDuringUpdates(t *testing.T) {
	l := upLab(t, behaviour(t, serverFromClient80, policy.Options{}), Options{CutDenied: true})
	ctx, cancel := context.WithCancel(context.Background())
	type stable struct {
		src, dst string
		port     uint16
		want     bool
	}
	flows := []stable{
		{clientIP4, serverIP4, 80, true},
		{clientIP4, serverIP4, 7000, false},
		{otherIP4, serverIP4, 80, false},
		{clientIP4, otherIP4, 80, true},
	}
	var mu sync.Mutex
	var wrong []string
	probes := 0
	var wg sync.WaitGroup
	for _, f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// A dropped SYN is retransmitted after 1 s: a probe that
				// needs longer than 900 ms saw a drop, however busy the
				// machine is.
				o, err := l.probeErr(f.src, f.dst, policy.ProtoTCP, f.port, 900*time.Millisecond)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				probes++
				if o.Reached() != f.want {
					wrong = append(wrong, fmt.Sprintf("%s -> %s:%d: %v", f.src, f.dst, f.port, o))
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	for i := 0; i < 100; i++ {
		extra := serverFromClient80 + fmt.Sprintf(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: local-%d, namespace: app}
spec:
  podSelector: {matchLabels: {role: local}}
  ingress:
  - ports: [{port: %d}]
`, i%7, 1000+i)
		if _, err := l.Apply(context.Background(), behaviour(t, extra, policy.Options{}), nil); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
	}
	cancel()
	wg.Wait()
	t.Logf("%d probes during 100 updates", probes)
	if len(wrong) > 0 {
		t.Errorf("%d wrong verdicts, e.g. %v", len(wrong), wrong[:min(len(wrong), 5)])
	}
	if probes < 20 {
		t.Errorf("only %d probes ran during the updates", probes)
	}
}

// TestRunMeasuresBothFamilies: a dual-stack pair is two flows, and lab run
// sends real packets over each. The policy denies the client's IPv6
// prefix only: the IPv6 flow is measured denied beside the IPv4 one
// measured allowed, and the measured matrix marks the cell mixed.
func TestRunMeasuresBothFamilies(t *testing.T) {
	testenv.RequirePrivileged(t)
	prog := behaviour(t, denyClientV6, policy.Options{IngressNetworksAndNodes: true})
	only := func(f matrix.Flow) bool {
		return f.From == "app/client" && f.To == "app/server" && f.Port == 80 && f.Protocol == "TCP"
	}
	rep, err := Run(context.Background(), prog, Options{}, ProbeOptions{Only: only})
	if err != nil {
		t.Fatal(err)
	}
	var v4, v6 *Flow
	for i := range rep.Flows {
		f := &rep.Flows[i]
		switch {
		case !f.OtherFamily && f.SrcIP == clientIP4 && f.DstIP == serverIP4:
			v4 = f
		case f.OtherFamily && f.SrcIP == clientIP6 && f.DstIP == serverIP6:
			v6 = f
		}
	}
	if v4 == nil || v6 == nil {
		t.Fatalf("report %+v: want the IPv4 cell and its IPv6 flow", rep.Flows)
	}
	if !v4.Measured || !v4.Allowed || !v4.Agree {
		t.Errorf("IPv4 flow %+v: want measured, allowed, agreeing", *v4)
	}
	if !v6.Measured || v6.Allowed || !v6.Agree {
		t.Errorf("IPv6 flow %+v: want measured, denied, agreeing", *v6)
	}
	m := rep.Matrix()
	if len(m.Flows) != 1 || !m.Flows[0].Mixed() || m.Flows[0].OtherFamilies[0].Allowed {
		t.Errorf("measured matrix %+v: want one mixed cell whose IPv6 flow is denied", m.Flows)
	}
}
