package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// Apply programs every node with prog (the topology stays: pods, nodes
// and addresses must not change). A lab made by moat lab up needs
// snapshot, the manifests prog came from: Apply records them as pending
// before it touches a rule and as applied once every node has the new
// rules, so a process killed at any point leaves a lab that the next Open
// puts back in step (see Open). If a node fails, every node is put back on
// the rules before.
func (l *Lab) Apply(ctx context.Context, prog *policy.Program, snapshot func(dir string) error) ([]nft.Result, error) {
	if l.st.Unenforced {
		return nil, fmt.Errorf("lab %s is programmed by agents, not by the lab", l.Name())
	}
	topo, err := planTopology(l.Name(), prog, l.st.Peers)
	if err != nil {
		return nil, err
	}
	if a, b := mustJSON(topo), mustJSON(l.st.Topology); a != b {
		return nil, errors.New("the manifests change pods, nodes or addresses: apply only changes policies and labels (run moat lab down and up for a new topology)")
	}
	if !l.st.Detached {
		res, err := l.program(ctx, prog)
		if err != nil {
			return res, l.rolledBack(ctx, err)
		}
		l.prog = prog
		return res, nil
	}
	if snapshot == nil {
		return nil, errors.New("apply to a lab made by moat lab up needs the manifests")
	}
	unlock, err := l.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Another process may have applied since this one opened the lab.
	if err := l.reload(ctx); err != nil {
		return nil, err
	}
	next := applied{Manifests: manifestsDir(l.nextGeneration()), Policy: prog.Options}
	dir := filepath.Join(l.dir, next.Manifests)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := snapshot(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("copy manifests: %w", err)
	}
	l.st.Pending = &next
	if err := l.save(); err != nil {
		return nil, err
	}
	l.at("pending")
	res, err := l.program(ctx, prog)
	if err != nil {
		return res, l.rolledBack(ctx, err)
	}
	l.at("programmed")
	return res, l.commit(prog)
}

// WriteResults prints what Apply did on each node: operations, what the
// node's table holds, and the nft package's warnings.
func (l *Lab) WriteResults(w io.Writer, results []nft.Result) {
	for i, r := range results {
		fmt.Fprintf(w, "node %s: %d operations, %d chains, %d rules, %d sets, %d elements\n",
			l.st.Topology.Nodes[i].Name, r.Operations, r.Stats.Chains, r.Stats.Rules, r.Stats.Sets, r.Stats.Elements)
		for _, warn := range r.Warnings {
			fmt.Fprintf(w, "node %s: warning: %s\n", l.st.Topology.Nodes[i].Name, warn)
		}
	}
}

// rolledBack puts the previous rules back after programming failed with
// cause, and says how that went.
func (l *Lab) rolledBack(ctx context.Context, cause error) error {
	if err := l.restore(ctx); err != nil {
		return fmt.Errorf("%w; putting the previous rules back failed too (%v): the next lab command tries again", cause, err)
	}
	return fmt.Errorf("%w (every node is back on the previous rules)", cause)
}

// restore programs every node with l.prog, the applied Program, and
// forgets a pending apply.
func (l *Lab) restore(ctx context.Context) error {
	if _, err := l.program(ctx, l.prog); err != nil {
		return err
	}
	if l.st.Pending == nil {
		return nil
	}
	_ = os.RemoveAll(filepath.Join(l.dir, l.st.Pending.Manifests))
	l.st.Pending = nil
	return l.save()
}

// commit makes the pending manifests the applied ones and removes older
// copies.
func (l *Lab) commit(prog *policy.Program) error {
	l.st.Manifests, l.st.Policy = l.st.Pending.Manifests, l.st.Pending.Policy
	l.st.Pending = nil
	if err := l.save(); err != nil {
		return err
	}
	l.prog = prog
	entries, _ := os.ReadDir(l.dir)
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "manifests-") && e.Name() != l.st.Manifests {
			_ = os.RemoveAll(filepath.Join(l.dir, e.Name()))
		}
	}
	return nil
}

// nextGeneration numbers a new copy of the manifests above every existing
// one.
func (l *Lab) nextGeneration() int {
	gen := 0
	for _, m := range []string{l.st.Manifests, pendingName(l.st.Pending)} {
		if n, err := strconv.Atoi(strings.TrimPrefix(m, "manifests-")); err == nil && n > gen {
			gen = n
		}
	}
	return gen + 1
}

func pendingName(p *applied) string {
	if p == nil {
		return ""
	}
	return p.Manifests
}

// reload reads the state again under the lock and puts the rules in step
// with it when an apply was interrupted.
func (l *Lab) reload(ctx context.Context) error {
	st, err := load(l.Name())
	if err != nil {
		return err
	}
	l.st = st
	if l.st.Pending != nil {
		return l.finishPending(ctx)
	}
	l.prog, err = l.compile(applied{Manifests: st.Manifests, Policy: st.Policy})
	return err
}

// rollForward finishes an apply that a killed process left pending.
func (l *Lab) rollForward(ctx context.Context) error {
	if l.st.Pending == nil {
		return nil
	}
	unlock, err := l.lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := load(l.Name())
	if err != nil {
		return err
	}
	l.st = st
	if l.st.Pending == nil {
		return nil // it finished while this process waited for the lock
	}
	return l.finishPending(ctx)
}

// finishPending programs the pending manifests and commits them; if that
// fails, it puts the applied manifests' rules back.
func (l *Lab) finishPending(ctx context.Context) error {
	p := *l.st.Pending
	prog, err := l.compile(p)
	if err == nil {
		_, err = l.program(ctx, prog)
	}
	if err == nil {
		l.warnings = append(l.warnings, fmt.Sprintf("lab %s: finished an apply that was interrupted (%s)", l.Name(), p.Manifests))
		return l.commit(prog)
	}
	prev, perr := l.compile(applied{Manifests: l.st.Manifests, Policy: l.st.Policy})
	if perr == nil {
		l.prog = prev
		if perr = l.restore(ctx); perr == nil {
			l.warnings = append(l.warnings, fmt.Sprintf("lab %s: an interrupted apply could not be finished, the previous rules are back: %v", l.Name(), err))
			return nil
		}
	}
	return fmt.Errorf("lab %s: an interrupted apply left rules out of step with the manifests; finishing it failed (%v), and so did rolling back (%v): run moat lab apply again, or moat lab down", l.Name(), err, perr)
}

// compile loads a copy of manifests and compiles it.
func (l *Lab) compile(a applied) (*policy.Program, error) {
	if a.Manifests == "" {
		return nil, fmt.Errorf("lab %s records no manifests", l.Name())
	}
	res, err := (&manifest.Loader{}).Load(filepath.Join(l.dir, a.Manifests))
	if err != nil {
		return nil, fmt.Errorf("lab %s: applied manifests: %w", l.Name(), err)
	}
	if len(res.Dropped) > 0 {
		return nil, fmt.Errorf("lab %s: %d object(s) of the applied manifests could not be loaded", l.Name(), len(res.Dropped))
	}
	return policy.Compile(&res.Cluster, a.Policy), nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
