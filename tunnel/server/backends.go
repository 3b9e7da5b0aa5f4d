package server

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
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
	id string
	// node is the node the agent's credentials bind it to, "" if none.
	node   string
	idents proto.Identifiers
	// vouched are the names and addresses its node's certificate lists
	// (its SANs), claimed or not: that node's too.
	vouched proto.Identifiers
	sess    *mux.Session
}

// backends are the connected agents, and what this server has learnt
// about which destinations are nodes' own.
type backends struct {
	mu   sync.Mutex
	list []*backend
	// hostOwners and addrOwners map every name and address a bound agent
	// has claimed (and its node's name) to that node. They outlive the
	// agent's tunnel: while a node's agent is away (restart, upgrade, a
	// reconnect) its addresses stay its own, so that no other agent gets
	// its connections. A bound agent can only claim what its credentials
	// vouch for, so they hold no more than the nodes' names and addresses.
	hostOwners map[string]string
	addrOwners map[netip.Addr]string
	// nodeCIDRs are Config.NodeCIDRs: every address in them is a node's.
	nodeCIDRs []netip.Prefix
	gauge     prometheus.Gauge
}

func newBackends(g prometheus.Gauge, nodeCIDRs []netip.Prefix) *backends {
	return &backends{gauge: g, nodeCIDRs: nodeCIDRs, hostOwners: map[string]string{}, addrOwners: map[netip.Addr]string{}}
}

func (bs *backends) add(b *backend) {
	bs.mu.Lock()
	if b.node != "" {
		bs.hostOwners[strings.ToLower(b.node)] = b.node
		for _, id := range []proto.Identifiers{b.idents, b.vouched} {
			for _, h := range id.Hosts {
				bs.hostOwners[h] = b.node
			}
			for _, a := range id.Addrs {
				bs.addrOwners[a] = b.node
			}
		}
	}
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

// sharing are the agentIDs of the other connected tunnels bound to b's
// node, while b is connected and bound.
func (bs *backends) sharing(b *backend) []string {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b.node == "" || !slices.Contains(bs.list, b) {
		return nil
	}
	var ids []string
	for _, x := range bs.list {
		if x != b && x.node == b.node {
			ids = append(ids, x.id)
		}
	}
	return ids
}

func (bs *backends) count() int {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return len(bs.list)
}

// nodeDestination says whether host is a node's own name or address (one
// a bound agent has claimed or its certificate lists, or in
// Config.NodeCIDRs), and why, for errors; owner is the node, where known.
func (bs *backends) nodeDestination(host string) (owner, why string, ok bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		// A zone does not make it another host: judged without it (and
		// then no claim matches it, so it is refused).
		a = a.WithZone("").Unmap()
		if node, ok := bs.addrOwners[a]; ok {
			return node, fmt.Sprintf("%s is node %q's address", host, node), true
		}
		for _, p := range bs.nodeCIDRs {
			if p.Contains(a) {
				return "", fmt.Sprintf("%s is in --node-address-cidrs %s", host, p), true
			}
		}
		return "", "", false
	}
	if node, ok := bs.hostOwners[strings.ToLower(strings.TrimSuffix(host, "."))]; ok {
		return node, fmt.Sprintf("%s is node %q's name", host, node), true
	}
	return "", "", false
}

// pick applies the strategies in order; within one strategy a non-draining
// agent is preferred and ties are broken at random. A node's own
// destination (nodeDestination) is different: it goes only to an agent
// that claims it (as destHost picks) or is bound to its node (an agent
// that does not announce its certificate's SANs: a stock one), whatever
// the strategies, and when none is connected the dial is refused instead
// of falling back to the default or defaultRoute strategy, whose pick
// would be any node's agent: one node's root must not receive another
// node's kubelet connections.
func (bs *backends) pick(strategies []Strategy, address string) (*backend, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if owner, why, ok := bs.nodeDestination(host); ok {
		if b := bs.pickLocked([]Strategy{StrategyDestHost}, host, owner); b != nil {
			return b, nil
		}
		return nil, fmt.Errorf("%w for %s: %s, and no connected agent claims it; a node's destinations go only to that node's agent, never to another's", errNoAgent, address, why)
	}
	if b := bs.pickLocked(strategies, host, ""); b != nil {
		return b, nil
	}
	return nil, errNoAgent
}

// pickLocked is pick's choice by strategies; destHost also picks the agents
// bound to owner, if set.
func (bs *backends) pickLocked(strategies []Strategy, host, owner string) *backend {
	for _, st := range strategies {
		var ready, draining []*backend
		for _, b := range bs.list {
			ok := false
			switch st {
			case StrategyDefault:
				ok = true
			case StrategyDestHost:
				ok = b.idents.MatchesHost(host) || (owner != "" && b.node == owner)
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
