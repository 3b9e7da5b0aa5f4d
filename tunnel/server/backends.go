package server

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-net/moat/tunnel/mux"
	"github.com/moat-net/moat/tunnel/proto"
)

// errNoAgent's text is upstream's, which clients may match on.
//
//lint:ignore ST1005 upstream's exact text
var errNoAgent = errors.New("No agent available")

// Strategy picks candidate agents for a destination (upstream --proxy-strategies).
type Strategy string

// Strategies upstream defines.
const (
	StrategyDefault      Strategy = "default"
	StrategyDestHost     Strategy = "destHost"
	StrategyDefaultRoute Strategy = "defaultRoute"
)

// ParseStrategies parses the comma-separated --proxy-strategies value.
func ParseStrategies(s string) ([]Strategy, error) {
	var out []Strategy
	for _, f := range strings.Split(s, ",") {
		switch st := Strategy(strings.TrimSpace(f)); st {
		case StrategyDefault, StrategyDestHost, StrategyDefaultRoute:
			out = append(out, st)
		default:
			return nil, fmt.Errorf("--proxy-strategies: unknown strategy %q (want default, destHost or defaultRoute)", f)
		}
	}
	return out, nil
}

type backend struct {
	id     string
	idents proto.Identifiers
	sess   *mux.Session
}

type backends struct {
	mu    sync.Mutex
	list  []*backend
	gauge prometheus.Gauge
}

func newBackends(g prometheus.Gauge) *backends { return &backends{gauge: g} }

func (bs *backends) add(b *backend) {
	bs.mu.Lock()
	bs.list = append(bs.list, b)
	bs.gauge.Set(float64(len(bs.list)))
	bs.mu.Unlock()
}

func (bs *backends) remove(b *backend) {
	bs.mu.Lock()
	for i, x := range bs.list {
		if x == b {
			bs.list = append(bs.list[:i], bs.list[i+1:]...)
			break
		}
	}
	bs.gauge.Set(float64(len(bs.list)))
	bs.mu.Unlock()
}

func (bs *backends) count() int {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return len(bs.list)
}

// pick applies the strategies in order; within one strategy a non-draining
// agent is preferred and ties are broken at random.
func (bs *backends) pick(strategies []Strategy, address string) *backend {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, st := range strategies {
		var ready, draining []*backend
		for _, b := range bs.list {
			ok := false
			switch st {
			case StrategyDefault:
				ok = true
			case StrategyDestHost:
				ok = b.idents.MatchesHost(host)
			case StrategyDefaultRoute:
				ok = b.idents.DefaultRoute
			}
			if !ok {
				continue
			}
			if b.sess.Draining() {
				draining = append(draining, b)
			} else {
				ready = append(ready, b)
			}
		}
		if len(ready) > 0 {
			return ready[rand.IntN(len(ready))]
		}
		if len(draining) > 0 {
			return draining[rand.IntN(len(draining))]
		}
	}
	return nil
}

func (bs *backends) draining() int {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	n := 0
	for _, b := range bs.list {
		if b.sess.Draining() {
			n++
		}
	}
	return n
}
