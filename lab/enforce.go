package lab

import (
	"context"
	"fmt"

	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// enforcer programs every node namespace of a lab with the nft package,
// the code path the agent uses on a real node (moat-agent --netns opens a
// node the same way).
type enforcer struct {
	topo    *topology
	syncers []*nft.Syncer
}

func newEnforcer(t *topology, ns *namespaces, cutDenied bool) (*enforcer, error) {
	e := &enforcer{topo: t}
	for _, n := range t.Nodes {
		h, err := ns.Get(n.NS)
		if err != nil {
			return nil, err
		}
		s, err := h.Dataplane(nft.Options{Node: n.Name, CutDenied: cutDenied})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		e.syncers = append(e.syncers, s)
	}
	return e, nil
}

// apply programs every node with its part of prog, one transaction per
// node, calling after (if set) once each node is done. It stops at the
// first node that fails (that node keeps its previous rules).
func (e *enforcer) apply(ctx context.Context, prog *policy.Program, after func(node int)) ([]nft.Result, error) {
	results := make([]nft.Result, len(e.syncers))
	for i, s := range e.syncers {
		r, err := s.Sync(ctx, prog)
		if err != nil {
			return results[:i], fmt.Errorf("node %q: %w", e.topo.Nodes[i].Name, err)
		}
		results[i] = r
		if after != nil {
			after(i)
		}
	}
	return results, nil
}
