package kubetest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// freePort asks the kernel for an unused TCP port on ip. Another process
// may take it before the server binds it; callers retry on "address already
// in use" (see portTaken).
func freePort(ip netip.Addr) (int, error) {
	l, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", ip, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portTaken reports whether a server log says it lost the race for its port.
func portTaken(log string) bool {
	return strings.Contains(log, "address already in use")
}

// startAttempts bounds the retries when a port race is lost.
const startAttempts = 3

// pollInterval is how often readiness is polled.
const pollInterval = 100 * time.Millisecond

// waitHTTP polls url until check accepts the response, the process exits,
// or ctx ends. It returns the last failure so a timeout says why.
func waitHTTP(ctx context.Context, client *http.Client, url string, p *process, check func(*http.Response) error) error {
	var last error
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("poll %s: %w", url, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			last = check(resp)
			resp.Body.Close()
			if last == nil {
				return nil
			}
		} else {
			last = err
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before %s answered (%v); last failure: %v", p.name, url, p.waitErr, last)
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w; last failure: %v", url, ctx.Err(), last)
		case <-tick.C:
		}
	}
}
