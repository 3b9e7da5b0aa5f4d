// Package lab builds a cluster's pods as Linux network namespaces on this
// machine, enforces its policies with the nft package (the agent's code
// path) and probes connectivity with real TCP and UDP packets.
//
// Topology: one namespace per node, routing for its pods like an L3 CNI
// (a veth per pod, host routes, no bridge); the nodes and an "outside"
// namespace for external peers share an underlay bridge in a namespace of
// its own; one namespace per pod-network pod; host-network pods live in
// their node's namespace. Nothing is added to the machine's own namespace.
// Every name starts with a per-run prefix, so labs can run side by side
// and `moat lab clean` can find leftovers.
package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Lab is a running lab.
type Lab struct {
	Topology   *Topology
	NS         *Namespaces
	enforcer   *Enforcer
	responders *Responders
}

// Options shape a lab.
type Options struct {
	// Prefix names the lab's namespaces; empty picks a fresh one.
	Prefix string
	// Peers are extra addresses outside the pod network.
	Peers []netip.Addr
	// Ports are the ports responders answer on; empty means every
	// distinct container port.
	Ports []matrix.PortProto
	// CutDenied removes established connections a new Program denies.
	CutDenied bool
}

// CheckHost reports why this machine cannot run a lab: not root, or no
// nft binary.
func CheckHost() error {
	if os.Geteuid() != 0 {
		return errors.New("the lab needs root (it creates network namespaces and nftables rules): run it with sudo")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("the lab needs the nft binary: install nftables (apt-get install nftables)")
	}
	return nil
}

// Up plans and builds a lab for prog, programs every node and starts
// responders on every port of every endpoint. On error nothing is left
// behind.
func Up(ctx context.Context, prog *policy.Program, opts Options) (_ *Lab, err error) {
	topo, err := plan(prog, &opts.Prefix, opts.Peers)
	if err != nil {
		return nil, err
	}
	ns, err := topo.Build()
	if err != nil {
		return nil, fmt.Errorf("build lab %s: %w", opts.Prefix, err)
	}
	lab := &Lab{Topology: topo, NS: ns}
	defer func() {
		if err != nil {
			err = errors.Join(err, lab.Close())
		}
	}()
	if lab.enforcer, err = NewEnforcer(topo, ns, EnforceOptions{CutDenied: opts.CutDenied}); err != nil {
		return nil, err
	}
	if _, err = lab.enforcer.Apply(ctx, prog); err != nil {
		return nil, err
	}
	cells, _, _, err := planCells(topo, prog, opts.Peers, opts.Ports)
	if err != nil {
		return nil, err
	}
	targets, err := targetsFor(topo, probeList(cells))
	if err != nil {
		return nil, err
	}
	if lab.responders, err = StartResponders(ns, targets); err != nil {
		return nil, err
	}
	return lab, nil
}

// Apply programs every node with a new Program (the topology stays).
func (l *Lab) Apply(ctx context.Context, prog *policy.Program) ([]nft.Result, error) {
	return l.enforcer.Apply(ctx, prog)
}

// Rulesets returns each node's programmed ruleset, by node name.
func (l *Lab) Rulesets() map[string]*nft.Ruleset { return l.enforcer.Rulesets() }

// Close stops responders and deletes every namespace of the lab.
func (l *Lab) Close() error {
	if l.responders != nil {
		l.responders.Close()
	}
	if l.enforcer != nil {
		l.enforcer.Close()
	}
	if l.NS != nil {
		l.NS.Close()
	}
	return l.Topology.Teardown()
}

// Run builds a lab, measures prog's matrix and tears the lab down again,
// also when ctx is cancelled.
func Run(ctx context.Context, prog *policy.Program, opts Options, popts ProbeOptions) (rep *Report, err error) {
	l, err := Up(ctx, prog, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("tear down lab %s: %w", l.Topology.Prefix, cerr))
		}
	}()
	return l.Measure(ctx, prog, opts.Peers, opts.Ports, popts)
}

// plan checks the host, picks a prefix when none is given and plans the
// topology: the first steps of every way to build a lab.
func plan(prog *policy.Program, prefix *string, peers []netip.Addr) (*Topology, error) {
	if err := CheckHost(); err != nil {
		return nil, err
	}
	if *prefix == "" {
		p, err := NewPrefix()
		if err != nil {
			return nil, err
		}
		*prefix = p
	}
	return Plan(*prefix, prog, peers)
}
