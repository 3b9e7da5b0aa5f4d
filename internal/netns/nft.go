package netns

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/nft"
)

// Dataplane returns an nft.Syncer for table inet moat inside the
// namespace, with conntrack cleanup, drop counter, nftables generation and
// table shape readings, and the routes of its pods (unless opts.Links is set), there
// too. Only the calls that reach the kernel enter the
// namespace; the caller's threads stay where they are.
func (n *NS) Dataplane(opts nft.Options) (*nft.Syncer, error) {
	var inner knftables.Interface
	if err := n.Do(func() error {
		var err error
		inner, err = nft.NewInterface()
		return err
	}); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", n.name, err)
	}
	iface := &nsNFT{ns: n, inner: inner}
	nl, err := n.Netlink()
	if err != nil {
		return nil, err
	}
	opts.Conntrack = nft.NetlinkConntrack{Handle: nl}
	// The namespace's descriptor stays open until Close, like nl.
	opts.Counters = nft.NetlinkCounters{NetNS: int(n.h)}
	opts.Generation = nft.NetlinkGeneration{NetNS: int(n.h)}
	opts.Shape = nft.NetlinkShape{NetNS: int(n.h)}
	if opts.Links == nil {
		opts.Links = nft.NetlinkLinks{Handle: nl}
	}
	return nft.New(iface, opts), nil
}

// Tables returns a knftables.Interface for one table of the namespace;
// every call that reaches the kernel runs inside it (knftables starts the
// nft binary per call).
func (n *NS) Tables(family knftables.Family, table string) (knftables.Interface, error) {
	var inner knftables.Interface
	if err := n.Do(func() error {
		var err error
		inner, err = knftables.New(family, table)
		return err
	}); err != nil {
		return nil, fmt.Errorf("nftables in network namespace %s: %w", n.name, err)
	}
	return &nsNFT{ns: n, inner: inner}, nil
}

type nsNFT struct {
	ns    *NS
	inner knftables.Interface
}

func (w *nsNFT) NewTransaction() *knftables.Transaction { return w.inner.NewTransaction() }

func (w *nsNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return w.ns.Do(func() error { return w.inner.Run(ctx, tx) })
}

func (w *nsNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return w.ns.Do(func() error { return w.inner.Check(ctx, tx) })
}

func (w *nsNFT) ListAll(ctx context.Context) (out map[string][]string, err error) {
	err = w.ns.Do(func() error { out, err = w.inner.ListAll(ctx); return err })
	return out, err
}

func (w *nsNFT) List(ctx context.Context, objectType string) (out []string, err error) {
	err = w.ns.Do(func() error { out, err = w.inner.List(ctx, objectType); return err })
	return out, err
}

func (w *nsNFT) ListRules(ctx context.Context, chain string) (out []*knftables.Rule, err error) {
	err = w.ns.Do(func() error { out, err = w.inner.ListRules(ctx, chain); return err })
	return out, err
}

func (w *nsNFT) ListElements(ctx context.Context, objectType, name string) (out []*knftables.Element, err error) {
	err = w.ns.Do(func() error { out, err = w.inner.ListElements(ctx, objectType, name); return err })
	return out, err
}

func (w *nsNFT) ListCounters(ctx context.Context) (out []*knftables.Counter, err error) {
	err = w.ns.Do(func() error { out, err = w.inner.ListCounters(ctx); return err })
	return out, err
}
