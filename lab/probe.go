package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/moat-net/moat/policy"
)

// Probe is one attempt to open a connection.
type Probe struct {
	// SrcNS is the namespace the connection starts in.
	SrcNS    string
	Src, Dst netip.Addr
	Proto    policy.Protocol
	Port     uint16
}

func (p Probe) String() string {
	return fmt.Sprintf("%s -> %s %s", p.Src, netip.AddrPortFrom(p.Dst, p.Port), p.Proto)
}

// Outcome is what a probe saw.
type Outcome int

// Outcomes. Refused counts as reached: the packet passed every filter and
// the destination answered (no responder on that port). DroppedLocally is
// a drop in the source's own namespace (a node or host-network pod): the
// kernel tells the sender with EPERM instead of letting it time out.
const (
	Reached Outcome = iota
	Refused
	TimedOut
	DroppedLocally
	Failed
)

// Reached reports whether packets got through both ways.
func (o Outcome) Reached() bool { return o == Reached || o == Refused }

func (o Outcome) String() string {
	return [...]string{"reached", "refused", "timed out", "dropped locally", "failed"}[o]
}

// ProbeResult is a probe's outcome; Err explains Failed.
type ProbeResult struct {
	Probe   Probe
	Outcome Outcome
	Err     error
}

// ProbeOptions bound probing.
type ProbeOptions struct {
	// Parallel is the most probes in flight (default 32).
	Parallel int
	// Timeout is how long a probe waits for an answer (default 800ms):
	// a dropped packet shows as a timeout.
	Timeout time.Duration
}

func (o ProbeOptions) withDefaults() ProbeOptions {
	if o.Parallel <= 0 {
		o.Parallel = 32
	}
	if o.Timeout <= 0 {
		o.Timeout = 800 * time.Millisecond
	}
	return o
}

// ProbeAll runs the probes with bounded parallelism and returns results in
// the same order.
func ProbeAll(ctx context.Context, ns *Namespaces, probes []Probe, opts ProbeOptions) []ProbeResult {
	opts = opts.withDefaults()
	out := make([]ProbeResult, len(probes))
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	for i, p := range probes {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i] = ProbeResult{Probe: p, Outcome: Failed, Err: ctx.Err()}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = ProbeOne(ctx, ns, p, opts.Timeout)
		}()
	}
	wg.Wait()
	return out
}

// ProbeOne opens one connection from inside the source namespace, bound
// to the source address, and waits for the destination's banner.
func ProbeOne(ctx context.Context, ns *Namespaces, p Probe, timeout time.Duration) ProbeResult {
	res := ProbeResult{Probe: p}
	h, err := ns.Get(p.SrcNS)
	if err != nil {
		res.Outcome, res.Err = Failed, err
		return res
	}
	var conn net.Conn
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = h.Do(func() error {
		// The socket is created here, so it lives in the source
		// namespace; the dial itself may block on any thread.
		var err error
		switch p.Proto {
		case policy.ProtoTCP:
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(p.Src, 0))}
			conn, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(p.Dst, p.Port).String())
		case policy.ProtoUDP:
			d := net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.Src, 0))}
			conn, err = d.DialContext(ctx, "udp", netip.AddrPortFrom(p.Dst, p.Port).String())
		default:
			err = fmt.Errorf("cannot probe protocol %s", p.Proto)
		}
		return err
	})
	if err != nil {
		res.Outcome, res.Err = classify(err)
		return res
	}
	defer conn.Close()
	// Cancelling ctx (Ctrl-C) unblocks a read at once.
	stop := context.AfterFunc(parent, func() { conn.Close() })
	defer stop()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	want := banner(p.Dst, p.Port)
	buf := make([]byte, len(want)+16)
	if p.Proto == policy.ProtoUDP {
		// One retry inside the timeout covers a datagram lost while
		// neighbours resolve.
		resend := time.AfterFunc(timeout/2, func() { _, _ = conn.Write([]byte("probe\n")) })
		defer resend.Stop()
		if _, err := conn.Write([]byte("probe\n")); err != nil {
			res.Outcome, res.Err = classify(err)
			return res
		}
	}
	n, err := readFull(conn, buf[:len(want)])
	if err != nil {
		res.Outcome, res.Err = classify(err)
		return res
	}
	if got := string(buf[:n]); got != want {
		res.Outcome, res.Err = Failed, fmt.Errorf("reached the wrong endpoint: got banner %q, want %q", got, want)
		return res
	}
	res.Outcome = Reached
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

func classify(err error) (Outcome, error) {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, net.ErrClosed):
		return Failed, context.Canceled
	case errors.Is(err, syscall.ECONNREFUSED):
		return Refused, nil
	case errors.Is(err, syscall.EPERM):
		return DroppedLocally, nil
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return TimedOut, nil
	}
	return Failed, err
}
