package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// probeSpec is one attempt to open a connection.
type probeSpec struct {
	// SrcNS is the namespace the connection starts in.
	SrcNS    string
	Src, Dst netip.Addr
	Proto    policy.Protocol
	Port     uint16
}

func (p probeSpec) String() string {
	return fmt.Sprintf("%s -> %s %s", p.Src, netip.AddrPortFrom(p.Dst, p.Port), p.Proto)
}

// outcome is what a probe saw.
type outcome int

// Outcomes. refused counts as reached: the packet passed every filter and
// the destination answered (no responder on that port). dropped is a drop
// the kernel reported for exactly this probe's packet (see trace.go).
// droppedLocally is a drop in the source's own namespace (a node or
// host-network pod): the kernel tells the sender with EPERM instead of
// letting it time out.
const (
	reached outcome = iota
	refused
	timedOut
	droppedLocally
	failed
	dropped
)

// Reached reports whether packets got through both ways.
func (o outcome) Reached() bool { return o == reached || o == refused }

func (o outcome) String() string {
	return [...]string{"reached", "refused", "timed out", "dropped locally", "failed", "dropped"}[o]
}

// probeResult is a probe's outcome; Err explains Failed, Evidence names
// the rule that dropped a Dropped probe.
type probeResult struct {
	Probe    probeSpec
	Outcome  outcome
	Err      error
	Evidence string
}

// ProbeOptions bound probing; zero values mean the defaults.
type ProbeOptions struct {
	// Parallel is the most probes in flight (default 64).
	Parallel int
	// Timeout is how long a probe waits for an answer (default 800ms)
	// when the kernel reports no drop for it.
	Timeout time.Duration
	// Only, when set, picks the flows of the matrix to measure (the
	// report holds only those); it sees each flow as the evaluator
	// judged it.
	Only func(matrix.Flow) bool

	// noEvidence makes probes wait for the timeout even when the
	// kernel reports a drop (benchmarks compare the two).
	noEvidence bool
}

// check rejects negative bounds.
func (o ProbeOptions) check() error {
	if o.Parallel < 0 {
		return fmt.Errorf("probes in flight: must not be negative, got %d", o.Parallel)
	}
	if o.Timeout < 0 {
		return fmt.Errorf("probe timeout: must be positive, got %s", o.Timeout)
	}
	return nil
}

func (o ProbeOptions) withDefaults() ProbeOptions {
	if o.Parallel <= 0 {
		o.Parallel = 64
	}
	if o.Timeout <= 0 {
		o.Timeout = 800 * time.Millisecond
	}
	return o
}

// prober runs probes in a lab's namespaces; with a tracer, a denied probe
// ends when the kernel reports its drop.
type prober struct {
	ns *namespaces
	tr *tracer
}

// all runs the probes with bounded parallelism and returns results in the
// same order.
func (pr *prober) all(ctx context.Context, probes []probeSpec, opts ProbeOptions) []probeResult {
	opts = opts.withDefaults()
	out := make([]probeResult, len(probes))
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	for i, p := range probes {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i] = probeResult{Probe: p, Outcome: failed, Err: ctx.Err()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = pr.one(ctx, p, opts.Timeout)
		}()
	}
	wg.Wait()
	return out
}

// evidence is the drop record a probe received, if any.
type evidence struct {
	rec  atomic.Pointer[dropRecord]
	stop func()
}

// one opens one connection from inside the source namespace, bound to the
// source address, and waits for the destination's banner.
func (pr *prober) one(ctx context.Context, p probeSpec, timeout time.Duration) probeResult {
	res := probeResult{Probe: p}
	h, err := pr.ns.Get(p.SrcNS)
	if err != nil {
		res.Outcome, res.Err = failed, err
		return res
	}
	var network string
	switch p.Proto {
	case policy.ProtoTCP:
		network = "tcp"
	case policy.ProtoUDP:
		network = "udp"
	default:
		res.Outcome, res.Err = failed, fmt.Errorf("cannot probe protocol %s", p.Proto)
		return res
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ev evidence
	defer func() {
		if ev.stop != nil {
			ev.stop()
		}
	}()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var berr error
		if err := c.Control(func(fd uintptr) { berr = pr.bind(pctx, cancel, int(fd), p, &ev) }); err != nil {
			return err
		}
		return berr
	}}
	var conn net.Conn
	// The socket is created here, so it lives in the source namespace;
	// the dial itself may block on any thread.
	err = h.Do(func() error {
		var err error
		conn, err = d.DialContext(pctx, network, netip.AddrPortFrom(p.Dst, p.Port).String())
		return err
	})
	if err != nil {
		return judge(res, err, &ev, ctx)
	}
	defer conn.Close()
	// The deadline, Ctrl-C and a drop record all end the wait at once.
	stop := context.AfterFunc(pctx, func() { conn.Close() })
	defer stop()
	want := banner(p.Dst, p.Port)
	buf := make([]byte, len(want)+16)
	if p.Proto == policy.ProtoUDP {
		// One retry inside the timeout covers a datagram lost while
		// neighbours resolve.
		resend := time.AfterFunc(timeout/2, func() { _, _ = conn.Write([]byte("probe\n")) })
		defer resend.Stop()
		if _, err := conn.Write([]byte("probe\n")); err != nil {
			return judge(res, err, &ev, ctx)
		}
	}
	n, err := readFull(conn, buf[:len(want)])
	if err != nil {
		return judge(res, err, &ev, ctx)
	}
	if got := string(buf[:n]); got != want {
		res.Outcome, res.Err = failed, fmt.Errorf("reached the wrong endpoint: got banner %q, want %q", got, want)
		return res
	}
	res.Outcome = reached
	return res
}

// bind binds the probe's socket to its source address (the kernel picks
// the port) before the first packet leaves and, with a tracer, watches
// for a drop of exactly that flow, which cancels the probe.
func (pr *prober) bind(ctx context.Context, cancel context.CancelFunc, fd int, p probeSpec, ev *evidence) error {
	var sa unix.Sockaddr
	if p.Src.Is4() {
		sa = &unix.SockaddrInet4{Addr: p.Src.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: p.Src.As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind %s: %w", p.Src, err)
	}
	if pr.tr == nil {
		return nil
	}
	bound, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("getsockname: %w", err)
	}
	var port int
	switch a := bound.(type) {
	case *unix.SockaddrInet4:
		port = a.Port
	case *unix.SockaddrInet6:
		port = a.Port
	}
	k := flowKey{proto: p.Proto, src: netip.AddrPortFrom(p.Src, uint16(port)), dst: netip.AddrPortFrom(p.Dst, p.Port)}
	ch, stop := pr.tr.watch(k)
	ev.stop = stop
	go func() {
		select {
		case d := <-ch:
			ev.rec.Store(&d)
			cancel()
		case <-ctx.Done():
		}
	}()
	return nil
}

// judge turns a probe's error into its outcome: a drop record wins, then
// what the kernel told the socket, then the deadline.
func judge(res probeResult, err error, ev *evidence, parent context.Context) probeResult {
	if d := ev.rec.Load(); d != nil {
		res.Outcome, res.Evidence = dropped, d.String()
		return res
	}
	if parent.Err() != nil {
		res.Outcome, res.Err = failed, context.Canceled
		return res
	}
	res.Outcome, res.Err = classify(err)
	return res
}

func readFull(c net.Conn, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
		if _, udp := c.(*net.UDPConn); udp {
			break
		}
	}
	return n, nil
}

func classify(err error) (outcome, error) {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return failed, context.Canceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return refused, nil
	case errors.Is(err, syscall.EPERM):
		return droppedLocally, nil
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout(),
		// The deadline closes the connection to end a read.
		errors.Is(err, net.ErrClosed):
		return timedOut, nil
	}
	return failed, err
}
