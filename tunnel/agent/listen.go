package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/moat-net/moat/tunnel/dest"
	"github.com/moat-net/moat/tunnel/mux"
)

// listen opens one listener per target on the bind address (KEP-2025).
func (a *Agent) listen(ctx context.Context) error {
	if a.cfg.BindAddress == nil {
		return fmt.Errorf("--target needs --bind-address")
	}
	for _, t := range a.cfg.Targets {
		addr := net.JoinHostPort(a.cfg.BindAddress.String(), strconv.Itoa(int(t.LocalPort)))
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			a.closeListeners()
			return fmt.Errorf("--target %d: listen %s: %w", t.LocalPort, addr, err)
		}
		a.listenMu.Lock()
		a.listeners = append(a.listeners, ln)
		a.listenMu.Unlock()
		a.log.Info("Forwarding node clients", "listen", addr, "destination", t.Dest.String())
		a.wg.Add(1)
		go a.accept(ctx, ln, t)
	}
	return nil
}

func (a *Agent) closeListeners() {
	a.listenMu.Lock()
	defer a.listenMu.Unlock()
	for _, l := range a.listeners {
		l.Close()
	}
	a.listeners = nil
}

func (a *Agent) accept(ctx context.Context, ln net.Listener, t dest.Target) {
	defer a.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.forward(ctx, nc, t)
		}()
	}
}

// forward tunnels one node client. The agent waits for the server's
// DIAL_RSP at most DialTimeout: a stock server silently ignores the request.
func (a *Agent) forward(ctx context.Context, nc net.Conn, t dest.Target) {
	tun := a.pick()
	if tun == nil {
		a.log.Info("Node client refused: no tunnel up", "client", nc.RemoteAddr().String())
		nc.Close()
		return
	}
	dctx, cancel := context.WithTimeout(ctx, a.cfg.DialTimeout)
	c, err := tun.sess.Dial(dctx, t.Dest.String())
	cancel()
	if err != nil {
		a.log.Info("Node client refused", "destination", t.Dest.String(), "serverID", tun.serverID, "err", err)
		nc.Close()
		return
	}
	mux.Pipe(nc, c)
}
