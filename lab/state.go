package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

// StateRoot holds one directory per running lab (`moat lab up`): its
// topology, options, a copy of the manifests last applied, and the
// responder process. It lives on /run, so a reboot clears it together
// with the namespaces it describes.
const StateRoot = "/run/moat-lab"

// State is what later commands need to find a running lab again.
type State struct {
	Topology  *Topology          `json:"topology"`
	Peers     []netip.Addr       `json:"peers,omitempty"`
	Ports     []matrix.PortProto `json:"ports,omitempty"`
	Policy    policy.Options     `json:"policy"`
	CutDenied bool               `json:"cutDenied"`
	// ServerPID is the process answering on every port.
	ServerPID int `json:"serverPID,omitempty"`
}

// Dir is the lab's state directory.
func (s *State) Dir() string { return filepath.Join(StateRoot, s.Topology.Prefix) }

// ManifestsDir holds the copy of the manifests last applied.
func (s *State) ManifestsDir() string { return filepath.Join(s.Dir(), "manifests") }

// LogPath is where the responder process writes.
func (s *State) LogPath() string { return filepath.Join(s.Dir(), "server.log") }

func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode lab state: %w", err)
	}
	if err := os.MkdirAll(s.Dir(), 0o700); err != nil {
		return fmt.Errorf("lab state: %w", err)
	}
	tmp := filepath.Join(s.Dir(), "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("lab state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(s.Dir(), "state.json"))
}

// LoadState reads a running lab's state. An empty prefix picks the only
// running lab.
func LoadState(prefix string) (*State, error) {
	if prefix == "" {
		labs, err := Running()
		if err != nil {
			return nil, err
		}
		switch len(labs) {
		case 0:
			return nil, errors.New("no lab is running (start one with moat lab up)")
		case 1:
			prefix = labs[0]
		default:
			return nil, fmt.Errorf("%d labs are running (%s): choose one with --lab", len(labs), strings.Join(labs, ", "))
		}
	}
	b, err := os.ReadFile(filepath.Join(StateRoot, prefix, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("lab %s: %w", prefix, err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab %s: state: %w", prefix, err)
	}
	if s.Topology == nil || s.Topology.Prefix != prefix {
		return nil, fmt.Errorf("lab %s: state names another lab", prefix)
	}
	return &s, nil
}

// Running lists the prefixes of labs with state.
func Running() ([]string, error) {
	entries, err := os.ReadDir(StateRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list labs: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), NamePrefix) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// CreateOptions describe a lab that outlives the command that made it.
type CreateOptions struct {
	Options
	Policy policy.Options
	// Snapshot copies the manifests into dir, so later commands judge
	// what was applied even if the files change.
	Snapshot func(dir string) error
	// Server is the command line of the responder process; "--lab
	// PREFIX" is appended. It must call Serve and print "ready".
	Server []string
}

// Create builds a lab, programs it, records its state and starts the
// responder process. On error nothing is left behind.
func Create(ctx context.Context, prog *policy.Program, opts CreateOptions) (st *State, err error) {
	topo, err := plan(prog, &opts.Prefix, opts.Peers)
	if err != nil {
		return nil, err
	}
	if _, _, _, err := planCells(topo, prog, opts.Peers, opts.Ports); err != nil {
		return nil, err
	}
	st = &State{Topology: topo, Peers: opts.Peers, Ports: opts.Ports, Policy: opts.Policy, CutDenied: opts.CutDenied}
	ns, err := topo.Build()
	if err != nil {
		return nil, fmt.Errorf("build lab %s: %w", topo.Prefix, err)
	}
	defer ns.Close()
	defer func() {
		if err != nil {
			err = errors.Join(err, Destroy(st))
			st = nil
		}
	}()
	if err = st.save(); err != nil {
		return st, err
	}
	if opts.Snapshot != nil {
		if err = opts.Snapshot(st.ManifestsDir()); err != nil {
			return st, fmt.Errorf("copy manifests: %w", err)
		}
	}
	if _, err = st.apply(ctx, ns, prog); err != nil {
		return st, err
	}
	argv := append(append([]string{}, opts.Server...), "--lab", topo.Prefix)
	if st.ServerPID, err = spawnServer(ctx, argv, st.LogPath()); err != nil {
		return st, err
	}
	return st, st.save()
}

// Apply programs every node of a running lab with prog (one full replace
// per node: this process does not know what an earlier one programmed).
// The topology must not change: pods, nodes and addresses stay.
func (s *State) Apply(ctx context.Context, prog *policy.Program, snapshot func(dir string) error) ([]nft.Result, error) {
	topo, err := Plan(s.Topology.Prefix, prog, s.Peers)
	if err != nil {
		return nil, err
	}
	if a, b := mustJSON(topo), mustJSON(s.Topology); a != b {
		return nil, errors.New("the manifests change pods, nodes or addresses: apply only changes policies and labels (run moat lab down and up for a new topology)")
	}
	ns, err := s.Topology.Open()
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	res, err := s.apply(ctx, ns, prog)
	if err != nil {
		return res, err
	}
	s.Policy = prog.Options
	if err := s.save(); err != nil {
		return res, err
	}
	if snapshot != nil {
		tmp := s.ManifestsDir() + ".new"
		_ = os.RemoveAll(tmp)
		if err := snapshot(tmp); err != nil {
			return res, fmt.Errorf("copy manifests: %w", err)
		}
		_ = os.RemoveAll(s.ManifestsDir())
		if err := os.Rename(tmp, s.ManifestsDir()); err != nil {
			return res, fmt.Errorf("copy manifests: %w", err)
		}
	}
	return res, nil
}

func (s *State) apply(ctx context.Context, ns *Namespaces, prog *policy.Program) ([]nft.Result, error) {
	e, err := NewEnforcer(s.Topology, ns, EnforceOptions{CutDenied: s.CutDenied})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	return e.Apply(ctx, prog)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Measure probes prog's matrix in a running lab. SCTP flows are judged by
// the rules Build derives from prog, which is what Apply programmed.
func (s *State) Measure(ctx context.Context, prog *policy.Program, opts ProbeOptions) (*Report, error) {
	ns, err := s.Topology.Open()
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	rulesets := map[string]*nft.Ruleset{}
	for _, n := range s.Topology.Nodes {
		rulesets[n.Name] = nft.Build(prog, n.Name)
	}
	return Measure(ctx, s.Topology, ns, rulesets, prog, s.Peers, s.Ports, opts)
}

// Serve runs the responders of a running lab until ctx ends. It writes
// "ready" to ready once every port answers.
func Serve(ctx context.Context, s *State, prog *policy.Program, ready io.Writer) error {
	ns, err := s.Topology.Open()
	if err != nil {
		return err
	}
	defer ns.Close()
	cells, _, _, err := planCells(s.Topology, prog, s.Peers, s.Ports)
	if err != nil {
		return err
	}
	targets, err := targetsFor(s.Topology, probeList(cells))
	if err != nil {
		return err
	}
	r, err := StartResponders(ns, targets)
	if err != nil {
		return err
	}
	fmt.Fprintln(ready, "ready")
	r.Wait(ctx)
	return nil
}

// spawnServer starts the responder process in its own session and waits
// for its "ready" line.
func spawnServer(ctx context.Context, argv []string, logPath string) (int, error) {
	if len(argv) == 0 {
		return 0, errors.New("no responder command")
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("responder log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start responders (%s): %w", argv[0], err)
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		if l == "ready" {
			pid := cmd.Process.Pid // Release forgets it
			_ = cmd.Process.Release()
			return pid, nil
		}
	case <-time.After(30 * time.Second):
	case <-ctx.Done():
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	msg, _ := os.ReadFile(logPath)
	return 0, fmt.Errorf("responders did not start: %s", strings.TrimSpace(string(msg)))
}

// Destroy stops a lab's responders, deletes its namespaces and state.
func Destroy(s *State) error {
	var errs []error
	if s.ServerPID > 0 {
		stopProcess(s.ServerPID)
	}
	if err := s.Topology.Teardown(); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.Dir()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// stopProcess ends a responder process if it is still one of ours.
func stopProcess(pid int) {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "--lab") {
		return
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	for i := 0; i < 100; i++ {
		if !Alive(pid) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = p.Kill()
}

// Alive reports whether a process exists and has not exited (a zombie
// waiting for its parent counts as exited).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// Clean removes what labs left behind: responder processes of recorded
// labs, namespaces and state. With an empty prefix it removes every lab
// (every namespace whose name starts with "moat-"); otherwise only the lab
// with that prefix. It returns what it removed.
func Clean(prefix string) ([]string, error) {
	if prefix != "" && !strings.HasPrefix(prefix, NamePrefix) {
		return nil, fmt.Errorf("lab %q: lab names start with %q", prefix, NamePrefix)
	}
	var removed []string
	var errs []error
	labs, err := Running()
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range labs {
		if prefix != "" && p != prefix {
			continue
		}
		if s, err := LoadState(p); err == nil && s.ServerPID > 0 {
			stopProcess(s.ServerPID)
		}
		if err := os.RemoveAll(filepath.Join(StateRoot, p)); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, "state "+p)
	}
	match := NamePrefix
	if prefix != "" {
		match = prefix + "-"
	}
	names, err := namedWithPrefix(match)
	if err != nil {
		errs = append(errs, err)
	}
	for _, n := range names {
		if err := deleteNamed(n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "netns "+n)
	}
	return removed, errors.Join(errs...)
}
