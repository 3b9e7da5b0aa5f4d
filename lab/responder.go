package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"github.com/moat-net/moat/policy"
)

// target is one port a responder answers on.
type target struct {
	NS    string
	Addr  netip.Addr
	Proto policy.Protocol
	Port  uint16
}

func (t target) String() string {
	return fmt.Sprintf("%s/%s in %s", netip.AddrPortFrom(t.Addr, t.Port), t.Proto, t.NS)
}

// banner is what a responder sends, so a probe knows it reached the
// endpoint it aimed at and not some other.
func banner(a netip.Addr, port uint16) string {
	return "moat " + netip.AddrPortFrom(a, port).String() + "\n"
}

// responders answer TCP connections and UDP datagrams on every target.
// Their sockets are created inside the targets' namespaces; serving them
// needs no namespace switch afterwards.
type responders struct {
	mu      sync.Mutex
	closers []func() error
	wg      sync.WaitGroup
}

// startResponders opens every target. A port already in use, or an
// address missing from its namespace, fails the whole start.
func startResponders(ns *namespaces, targets []target) (*responders, error) {
	r := &responders{}
	seen := map[target]bool{}
	for _, t := range targets {
		if seen[t] || !(t.Proto == policy.ProtoTCP || t.Proto == policy.ProtoUDP) {
			continue
		}
		seen[t] = true
		h, err := ns.Get(t.NS)
		if err == nil {
			err = h.Do(func() error { return r.open(t) })
		}
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("responder on %s/%s in %s: %w", netip.AddrPortFrom(t.Addr, t.Port), t.Proto, t.NS, err)
		}
	}
	return r, nil
}

func (r *responders) open(t target) error {
	ap := netip.AddrPortFrom(t.Addr, t.Port)
	fam := "4"
	if t.Addr.Is6() {
		fam = "6"
	}
	msg := []byte(banner(t.Addr, t.Port))
	switch t.Proto {
	case policy.ProtoTCP:
		l, err := net.ListenTCP("tcp"+fam, net.TCPAddrFromAddrPort(ap))
		if err != nil {
			return err
		}
		r.add(l.Close)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for {
				c, err := l.AcceptTCP()
				if err != nil {
					return
				}
				_, _ = c.Write(msg)
				_ = c.Close()
			}
		}()
	case policy.ProtoUDP:
		c, err := net.ListenUDP("udp"+fam, net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return err
		}
		r.add(c.Close)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			buf := make([]byte, 512)
			for {
				_, from, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				_, _ = c.WriteToUDPAddrPort(msg, from)
			}
		}()
	}
	return nil
}

func (r *responders) add(f func() error) {
	r.mu.Lock()
	r.closers = append(r.closers, f)
	r.mu.Unlock()
}

// Close stops every responder and waits for them.
func (r *responders) Close() {
	r.mu.Lock()
	cs := r.closers
	r.closers = nil
	r.mu.Unlock()
	for _, c := range cs {
		_ = c()
	}
	r.wg.Wait()
}

// targetsFor lists the responders probes need: each probe's destination.
func targetsFor(t *topology, probes []probeSpec) ([]target, error) {
	set := map[target]bool{}
	for _, p := range probes {
		place, ok := t.Locate(p.Dst)
		if !ok {
			return nil, fmt.Errorf("no namespace holds %s", p.Dst)
		}
		set[target{NS: place.NS, Addr: p.Dst.Unmap(), Proto: p.Proto, Port: p.Port}] = true
	}
	out := make([]target, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		return strings.Compare(out[i].String(), out[j].String()) < 0
	})
	return out, nil
}
