package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/nft"
)

// NetNS is a network namespace the agent programs instead of its own:
// `moat-agent --netns` lets one host run an agent per lab node (each node
// a namespace) while the agents reach the API server from the host's
// namespace. Only nftables and conntrack calls enter the namespace.
type NetNS struct {
	name string
	h    netns.NsHandle
	nl   *netlink.Handle
}

// OpenNetNS opens a named namespace (as `ip netns` names them, under
// /var/run/netns) or a path to a namespace file.
func OpenNetNS(nameOrPath string) (*NetNS, error) {
	path := nameOrPath
	if !strings.Contains(path, "/") {
		path = filepath.Join("/var/run/netns", path)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", nameOrPath, err)
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink in network namespace %s: %w", nameOrPath, err)
	}
	return &NetNS{name: nameOrPath, h: h, nl: nl}, nil
}

// Close releases the namespace.
func (n *NetNS) Close() {
	n.nl.Close()
	n.h.Close()
}

// errThreadLost: a thread could not return to its namespace and must not
// be reused.
var errThreadLost = errors.New("could not return a thread to its network namespace")

// Do runs f on a fresh OS thread inside the namespace. Processes f starts
// (knftables runs the nft binary) inherit the namespace.
func (n *NetNS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := func() error {
			orig, err := netns.Get()
			if err != nil {
				return fmt.Errorf("current network namespace: %w", err)
			}
			defer orig.Close()
			if err := netns.Set(n.h); err != nil {
				return fmt.Errorf("enter network namespace %s: %w", n.name, err)
			}
			ferr := f()
			if err := netns.Set(orig); err != nil {
				return errors.Join(ferr, errThreadLost)
			}
			return ferr
		}()
		if !errors.Is(err, errThreadLost) {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Dataplane returns an nft.Syncer for table inet moat inside the
// namespace, with conntrack cleanup there too.
func (n *NetNS) Dataplane(opts nft.Options) (*nft.Syncer, error) {
	var inner knftables.Interface
	if err := n.Do(func() error {
		var err error
		inner, err = nft.NewInterface()
		return err
	}); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", n.name, err)
	}
	opts.Conntrack = nft.NetlinkConntrack{Handle: n.nl}
	return nft.New(&nsNFT{ns: n, inner: inner}, opts), nil
}

// nsNFT runs every knftables call that reaches the kernel inside ns.
type nsNFT struct {
	ns    *NetNS
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
