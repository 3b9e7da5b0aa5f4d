// Package lab builds a cluster's pods as Linux network namespaces on this
// machine, enforces its policies with the nft package (the agent's code
// path) and probes connectivity with real TCP and UDP packets.
//
// Topology: one namespace per node, routing for its pods like an L3 CNI
// (a veth per pod, host routes, no bridge); the nodes and an "outside"
// namespace for external peers share an underlay bridge in a namespace of
// its own; one namespace per pod-network pod; host-network pods live in
// their node's namespace. Nothing is added to the machine's own namespace.
//
// One lifecycle: Up builds a lab (Run builds, measures and tears down);
// Open finds a running one; Apply, Measure and Close or Down work on
// either. Every lab has a name, which starts the names of its namespaces,
// and a state directory under /run/moat-lab, written before anything else
// is made. The state names the process that owns the lab: the one that
// built it, or for a lab that outlives its command (moat lab up) the
// process that answers on its ports. Clean removes only labs whose owner
// is gone.
//
// Measure trusts a reply for "allowed" and, for "denied", the kernel's
// trace record of this probe's packet being dropped by a policy rule, or
// no reply within the timeout twice (trace.go, docs/lab.md).
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"text/tabwriter"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Lab is a lab on this machine: built by Up, or a running one found again
// by Open. Close releases it (and tears down a lab this process owns).
type Lab struct {
	st  *state
	dir string
	ns  *namespaces
	// prog is what every node is programmed with.
	prog *policy.Program
	enf  *enforcer
	resp *responders
	// owned: Close tears the lab down.
	owned    bool
	warnings []string
	// hook, when set (tests), is called at named points of Apply.
	hook func(stage string)
}

// Options shape a lab.
type Options struct {
	// Name names the lab and starts its namespaces' names; empty picks a
	// fresh one.
	Name string
	// Peers are extra addresses: outside the cluster, or, when inside a
	// node's pod CIDRs, behind that node in a namespace of their own, as
	// a pod whose address the agent does not know.
	Peers []netip.Addr
	// Ports are the ports responders answer on; empty means every
	// distinct container port.
	Ports []matrix.PortProto
	// CutDenied removes established connections a new Program denies.
	CutDenied bool
	// Server makes the lab outlive this process (moat lab up): these
	// arguments, and "--lab NAME", make this program's own executable
	// answer on every port (it calls Open and Serve, which prints
	// "ready"). Snapshot is then required.
	Server []string
	// Snapshot copies the manifests prog came from into a directory, so
	// later commands judge what was applied even if the files change
	// (see Manifests).
	Snapshot func(dir string) error
	// Unenforced leaves the nodes' rules to others: moat-agent processes
	// started with --netns NodeNetns(node). The lab programs nothing and
	// refuses Apply; Measure still compares with prog.
	Unenforced bool
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

// Up builds a lab for prog: it records the lab's state, builds its
// namespaces, programs every node and starts responders on every port of
// every endpoint (in this process, or in the Server process). On error
// nothing is left behind.
func Up(ctx context.Context, prog *policy.Program, opts Options) (_ *Lab, err error) {
	if err := CheckHost(); err != nil {
		return nil, err
	}
	if len(opts.Server) > 0 && opts.Snapshot == nil {
		return nil, errors.New("a lab that outlives this process needs a snapshot of its manifests")
	}
	if len(opts.Server) > 0 && opts.Unenforced {
		return nil, errors.New("a lab that outlives this process is enforced by the lab")
	}
	if opts.Name == "" {
		if opts.Name, err = newName(); err != nil {
			return nil, err
		}
	}
	topo, err := planTopology(opts.Name, prog, opts.Peers)
	if err != nil {
		return nil, err
	}
	cells, _, _, err := planCells(topo, prog, opts.Peers, opts.Ports)
	if err != nil {
		return nil, err
	}
	owner, err := self()
	if err != nil {
		return nil, err
	}
	l := &Lab{
		st: &state{
			Topology: topo, Peers: opts.Peers, Ports: opts.Ports, Policy: prog.Options,
			CutDenied: opts.CutDenied, Owner: owner, Detached: len(opts.Server) > 0, Unenforced: opts.Unenforced,
		},
		dir:   filepath.Join(stateRoot, opts.Name),
		prog:  prog,
		owned: true,
	}
	// The state comes first: whenever this process dies, clean finds
	// what it made.
	if err := l.create(); err != nil {
		return nil, err
	}
	if l.ns, err = topo.Build(); err != nil {
		// Build removed what it made; a namespace whose name clashed
		// is someone else's.
		return nil, errors.Join(fmt.Errorf("build lab %s: %w", opts.Name, err), os.RemoveAll(l.dir))
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.Close())
		}
	}()
	if !opts.Unenforced {
		if _, err = l.program(ctx, prog); err != nil {
			return nil, err
		}
	}
	if !l.st.Detached {
		targets, err := targetsFor(topo, probeList(cells))
		if err != nil {
			return nil, err
		}
		if l.resp, err = startResponders(l.ns, targets); err != nil {
			return nil, err
		}
		return l, nil
	}
	gen := manifestsDir(1)
	if err = opts.Snapshot(filepath.Join(l.dir, gen)); err != nil {
		return nil, fmt.Errorf("copy manifests: %w", err)
	}
	l.st.Manifests = gen
	if err = l.save(); err != nil {
		return nil, err
	}
	if err = l.startServer(ctx, opts.Server); err != nil {
		return nil, err
	}
	l.owned = false
	return l, nil
}

// Name is the lab's name.
func (l *Lab) Name() string { return l.st.Topology.Prefix }

// NodeNetns is the name of a node's network namespace (under /run/netns),
// for `ip netns exec` and `moat-agent --netns`.
func (l *Lab) NodeNetns(node string) (string, error) {
	i := l.st.Topology.NodeByName(node)
	if i < 0 {
		return "", fmt.Errorf("lab %s has no node %q", l.Name(), node)
	}
	return l.st.Topology.Nodes[i].NS, nil
}

// Describe prints the lab's namespaces and addresses, and how to explore
// and change it.
func (l *Lab) Describe(w io.Writer) {
	t := l.st.Topology
	fmt.Fprintf(w, "lab %s is up\n\n", t.Prefix)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WHAT\tNAMESPACE\tADDRESSES")
	for _, n := range t.Nodes {
		fmt.Fprintf(tw, "node %s\t%s\t%v\n", n.Name, n.NS, n.Addrs)
	}
	for _, p := range t.Pods {
		fmt.Fprintf(tw, "pod %s\t%s\t%v\n", p.Key, p.NS, p.IPs)
	}
	if len(t.Outside.Addrs) > 0 {
		fmt.Fprintf(tw, "outside\t%s\t%v\n", t.Outside.NS, t.Outside.Addrs)
	}
	_ = tw.Flush()
	if len(t.Nodes) > 0 {
		fmt.Fprintf(w, "\nexplore:  ip netns exec %s nft list table inet moat\n", t.Nodes[0].NS)
	}
	fmt.Fprintf(w, "measure:  moat lab probe --lab %s\n", t.Prefix)
	fmt.Fprintf(w, "change:   moat lab apply --lab %s -f ...\n", t.Prefix)
	fmt.Fprintf(w, "remove:   moat lab down --lab %s\n", t.Prefix)
}

// rulesets returns each node's programmed ruleset, by node name.
func (l *Lab) rulesets() map[string]*nft.Ruleset {
	out := map[string]*nft.Ruleset{}
	for _, n := range l.st.Topology.Nodes {
		out[n.Name] = nft.Build(l.prog, n.Name)
	}
	return out
}

// program programs every node with prog.
func (l *Lab) program(ctx context.Context, prog *policy.Program) ([]nft.Result, error) {
	if l.enf == nil {
		e, err := newEnforcer(l.st.Topology, l.ns, l.st.CutDenied)
		if err != nil {
			return nil, err
		}
		l.enf = e
	}
	return l.enf.apply(ctx, prog, func(i int) { l.at(fmt.Sprintf("node %d programmed", i)) })
}

func (l *Lab) at(stage string) {
	if l.hook != nil {
		l.hook(stage)
	}
}

// Close stops this process's responders and releases the namespaces. A
// lab this process owns (built by Up without Server) is torn down: its
// namespaces and state are removed.
func (l *Lab) Close() error {
	if l.resp != nil {
		l.resp.Close()
		l.resp = nil
	}
	if l.ns != nil {
		l.ns.Close()
	}
	if !l.owned {
		return nil
	}
	l.owned = false
	return l.destroy()
}

// Run builds a lab, measures prog's matrix and tears the lab down again,
// also when ctx is cancelled. Problems tearing down are warnings in the
// report: they change neither the measured flows nor the error.
func Run(ctx context.Context, prog *policy.Program, opts Options, popts ProbeOptions) (*Report, error) {
	if len(opts.Server) > 0 {
		return nil, errors.New("run tears its lab down: no Server")
	}
	if err := popts.check(); err != nil {
		return nil, err
	}
	l, err := Up(ctx, prog, opts)
	if err != nil {
		return nil, err
	}
	rep, err := l.Measure(ctx, popts)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted; the lab is torn down: %w", err)
	}
	return finish(l, rep, err)
}

// finish closes a lab after measuring: a teardown problem becomes a
// warning of the report, or joins the error when there is no report.
func finish(l *Lab, rep *Report, err error) (*Report, error) {
	cerr := l.Close()
	if cerr == nil {
		return rep, err
	}
	cerr = fmt.Errorf("tear down lab %s: %w", l.Name(), cerr)
	if rep == nil {
		return nil, errors.Join(err, cerr)
	}
	rep.Warnings = append(rep.Warnings, cerr.Error())
	return rep, err
}
