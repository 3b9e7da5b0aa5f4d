package lab

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Enforcer programs every node namespace of a lab with the nft package,
// the same code path the agent uses on a real node.
type Enforcer struct {
	topo    *Topology
	ns      *Namespaces
	syncers []*nft.Syncer
	links   []*netlink.Handle
}

// EnforceOptions mirror the agent's switches.
type EnforceOptions struct {
	// CutDenied removes established connections a new Program denies.
	CutDenied bool
}

// NewEnforcer opens nftables in every node namespace.
func NewEnforcer(t *Topology, ns *Namespaces, opts EnforceOptions) (*Enforcer, error) {
	e := &Enforcer{topo: t, ns: ns}
	for _, n := range t.Nodes {
		h, err := ns.Get(n.NS)
		if err != nil {
			e.Close()
			return nil, err
		}
		var iface knftables.Interface
		if err := inNS(h, func() error {
			var err error
			iface, err = nft.NewInterface()
			return err
		}); err != nil {
			e.Close()
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		nl, err := netlink.NewHandleAt(h)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("node %s: netlink: %w", n.Name, err)
		}
		e.links = append(e.links, nl)
		e.syncers = append(e.syncers, nft.New(iface, nft.Options{
			Node:      n.Name,
			CutDenied: opts.CutDenied,
			Conntrack: nft.NetlinkConntrack{Handle: nl},
		}))
	}
	return e, nil
}

// Apply programs every node with its part of prog, one transaction per
// node. It reports every node's result; an error names the nodes that
// failed (their previous rules stay).
func (e *Enforcer) Apply(ctx context.Context, prog *policy.Program) ([]nft.Result, error) {
	results := make([]nft.Result, len(e.syncers))
	var errs []error
	for i, s := range e.syncers {
		n := e.topo.Nodes[i]
		h, err := e.ns.Get(n.NS)
		if err == nil {
			err = inNS(h, func() error {
				var err error
				results[i], err = s.Sync(ctx, prog)
				return err
			})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %q: %w", n.Name, err))
		}
	}
	return results, errors.Join(errs...)
}

// Rulesets returns what each node has programmed, by node name.
func (e *Enforcer) Rulesets() map[string]*nft.Ruleset {
	out := map[string]*nft.Ruleset{}
	for i, s := range e.syncers {
		if rs := s.Applied(); rs != nil {
			out[e.topo.Nodes[i].Name] = rs
		}
	}
	return out
}

// Close releases netlink handles; the tables stay until the namespaces go.
func (e *Enforcer) Close() {
	for _, l := range e.links {
		l.Close()
	}
	e.links = nil
}
