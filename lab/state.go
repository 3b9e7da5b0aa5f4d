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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-net/moat/internal/netns"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// stateRoot holds one directory per lab: its topology, options, owner, a
// copy of the manifests last applied (labs made by moat lab up) and the
// responder process's log. It lives on /run, so a reboot clears it
// together with the namespaces it describes.
const stateRoot = "/run/moat-lab"

// state is what a lab's directory records, in state.json.
type state struct {
	Topology  *topology          `json:"topology"`
	Peers     []netip.Addr       `json:"peers,omitempty"`
	Ports     []matrix.PortProto `json:"ports,omitempty"`
	Policy    policy.Options     `json:"policy"`
	CutDenied bool               `json:"cutDenied"`
	// Owner is the process whose end abandons the lab: the one that
	// built it, then, for a detached lab, its responder process.
	Owner process `json:"owner"`
	// Detached labs outlive the command that made them (moat lab up).
	Detached bool `json:"detached,omitempty"`
	// Unenforced labs are programmed by agents, not by the lab.
	Unenforced bool `json:"unenforced,omitempty"`
	// Server is a detached lab's responder process.
	Server process `json:"server,omitzero"`
	// Manifests is the directory (under the lab's) holding the copy of
	// the manifests every node is programmed with.
	Manifests string `json:"manifests,omitempty"`
	// Pending is an apply under way: its manifests are complete on disk
	// and some nodes may already have its rules. Whoever opens the lab
	// next finishes it (or rolls it back) before trusting the rules.
	Pending *applied `json:"pending,omitempty"`
}

// applied is a set of manifests and the options they compile with.
type applied struct {
	Manifests string         `json:"manifests"`
	Policy    policy.Options `json:"policy"`
}

// process identifies a process across PID reuse by its start time.
type process struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

func self() (process, error) {
	pid := os.Getpid()
	start, ok := startTime(pid)
	if !ok {
		return process{}, errors.New("read this process's start time from /proc")
	}
	return process{PID: pid, Start: start}, nil
}

// alive reports whether the process still runs (a zombie has ended).
func (p process) alive() bool {
	if p.PID <= 0 {
		return false
	}
	start, ok := startTime(p.PID)
	return ok && start == p.Start
}

// startTime reads a live process's start time (clock ticks since boot)
// from /proc/PID/stat; false for a process that is gone or a zombie.
func startTime(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command name (in parentheses, which may
	// itself hold spaces): state is the first, starttime the 20th.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

func manifestsDir(gen int) string { return fmt.Sprintf("manifests-%d", gen) }

// create makes the lab's directory, which must not exist (the name is
// taken otherwise), and writes its state.
func (l *Lab) create() error {
	if err := os.MkdirAll(stateRoot, 0o755); err != nil {
		return fmt.Errorf("lab state: %w", err)
	}
	if err := os.Mkdir(l.dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("lab %s exists already", l.Name())
		}
		return fmt.Errorf("lab state: %w", err)
	}
	if err := l.save(); err != nil {
		_ = os.RemoveAll(l.dir)
		return err
	}
	return nil
}

// save replaces state.json atomically.
func (l *Lab) save() error {
	b, err := json.MarshalIndent(l.st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode lab state: %w", err)
	}
	f, err := os.CreateTemp(l.dir, "state-*.tmp")
	if err != nil {
		return fmt.Errorf("lab state: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(l.dir, "state.json"))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("lab state: %w", err)
	}
	return nil
}

// load reads a lab's state.
func load(name string) (*state, error) {
	b, err := os.ReadFile(filepath.Join(stateRoot, name, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("lab %s: %w", name, err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab %s: state: %w", name, err)
	}
	if s.Topology == nil || s.Topology.Prefix != name {
		return nil, fmt.Errorf("lab %s: state names another lab", name)
	}
	return &s, nil
}

// lock takes the lab's lock (for changing its rules or state) until
// unlock; the kernel drops it when the process dies.
func (l *Lab) lock() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(l.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock lab %s: %w", l.Name(), err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock lab %s: %w", l.Name(), err)
	}
	return func() { f.Close() }, nil
}

// labNames lists the labs with a state directory.
func labNames() ([]string, error) {
	entries, err := os.ReadDir(stateRoot)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list labs: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), namePrefix) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// Open finds a running lab made by moat lab up (an empty name: the only
// one). If an apply was interrupted, Open first finishes it, or rolls it
// back, so that the rules always match the recorded manifests.
func Open(ctx context.Context, name string) (*Lab, error) {
	if name == "" {
		names, err := labNames()
		if err != nil {
			return nil, err
		}
		var up []string
		for _, n := range names {
			if st, err := load(n); err == nil && st.Detached && st.Owner.alive() {
				up = append(up, n)
			}
		}
		switch len(up) {
		case 0:
			return nil, errors.New("no lab is running (start one with moat lab up)")
		case 1:
			name = up[0]
		default:
			return nil, fmt.Errorf("%d labs are running (%s): choose one with --lab", len(up), strings.Join(up, ", "))
		}
	}
	st, err := load(name)
	if err != nil {
		return nil, err
	}
	if !st.Detached {
		return nil, fmt.Errorf("lab %s belongs to process %d (moat lab run or a test), which removes it when done: only labs made by moat lab up can be opened", name, st.Owner.PID)
	}
	if !st.Owner.alive() {
		return nil, fmt.Errorf("lab %s is not running (its process %d is gone): remove it with moat lab clean", name, st.Owner.PID)
	}
	l := &Lab{st: st, dir: filepath.Join(stateRoot, name)}
	if l.ns, err = st.Topology.Open(); err != nil {
		return nil, err
	}
	if err := l.rollForward(ctx); err != nil {
		l.Close()
		return nil, err
	}
	if l.prog, err = l.compile(applied{Manifests: l.st.Manifests, Policy: l.st.Policy}); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Down tears down a lab made by moat lab up: its responder process, its
// namespaces, its state.
func (l *Lab) Down() error {
	l.owned = false
	l.Close()
	return l.destroy()
}

// destroy stops a detached lab's responder process and removes the lab's
// namespaces, then its state (kept if a namespace stays, so that clean can
// try again).
func (l *Lab) destroy() error {
	if l.st.Detached {
		stopProcess(l.st.Server)
	}
	if err := l.st.Topology.Teardown(); err != nil {
		return err
	}
	return os.RemoveAll(l.dir)
}

// startServer starts a detached lab's responder process in its own
// session, records it, waits for its "ready" line and makes it the lab's
// owner.
func (l *Lab) startServer(ctx context.Context, argv []string) error {
	logPath := filepath.Join(l.dir, "server.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("responder log: %w", err)
	}
	defer logf.Close()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program for the responder process: %w", err)
	}
	cmd := exec.Command(exe, append(append([]string{}, argv...), "--lab", l.Name())...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start responders (%s): %w", exe, err)
	}
	fail := func(err error) error {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		msg, _ := os.ReadFile(logPath)
		return fmt.Errorf("responders did not start: %w: %s", err, strings.TrimSpace(string(msg)))
	}
	start, ok := startTime(cmd.Process.Pid)
	if !ok {
		return fail(errors.New("the process ended at once"))
	}
	l.st.Server = process{PID: cmd.Process.Pid, Start: start}
	if err := l.save(); err != nil {
		return fail(err)
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		if s != "ready" {
			return fail(fmt.Errorf("it said %q", s))
		}
	case <-time.After(30 * time.Second):
		return fail(errors.New("no answer in 30s"))
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	_ = cmd.Process.Release()
	l.st.Owner = l.st.Server
	return l.save()
}

// stopProcess ends a process if it still runs.
func stopProcess(p process) {
	if !p.alive() {
		return
	}
	proc, err := os.FindProcess(p.PID)
	if err != nil {
		return
	}
	_ = proc.Signal(syscall.SIGTERM)
	for i := 0; i < 100; i++ {
		if !p.alive() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = proc.Kill()
}

// Serve answers on every port of a lab made by moat lab up until ctx ends
// or the lab is removed. It writes "ready" to ready once every port
// answers.
func (l *Lab) Serve(ctx context.Context, ready io.Writer) error {
	cells, _, _, err := planCells(l.st.Topology, l.prog, l.st.Peers, l.st.Ports)
	if err != nil {
		return err
	}
	targets, err := targetsFor(l.st.Topology, probeList(cells))
	if err != nil {
		return err
	}
	r, err := startResponders(l.ns, targets)
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Fprintln(ready, "ready")
	// A lab removed by someone else (clean --force) leaves nothing to
	// serve.
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if _, err := os.Stat(filepath.Join(l.dir, "state.json")); errors.Is(err, os.ErrNotExist) {
				return nil
			}
		}
	}
}

// Clean removes labs whose owning process is gone (a crashed run, a
// killed moat lab up): their responder process, namespaces and state.
// With a name it considers only that lab. force also removes labs whose
// owner still runs and, with a name, namespaces named after it that no
// lab state describes. It never touches namespaces of no lab's. It
// returns one line per lab it removed or kept.
func Clean(name string, force bool) ([]string, error) {
	if name != "" && !strings.HasPrefix(name, namePrefix) {
		return nil, fmt.Errorf("lab %q: lab names start with %q", name, namePrefix)
	}
	names := []string{name}
	if name == "" {
		var err error
		if names, err = labNames(); err != nil {
			return nil, err
		}
	}
	var out []string
	var errs []error
	for _, n := range names {
		dir := filepath.Join(stateRoot, n)
		st, err := load(n)
		if err != nil {
			if _, serr := os.Stat(dir); serr == nil {
				// Nothing is built before the state is written.
				if err := os.RemoveAll(dir); err != nil {
					errs = append(errs, err)
					continue
				}
				out = append(out, fmt.Sprintf("removed lab %s (its state was never completed)", n))
				continue
			}
			msg, err := cleanUnrecorded(n, force)
			if err != nil {
				errs = append(errs, err)
			}
			out = append(out, msg)
			continue
		}
		if st.Owner.alive() && !force {
			how := "moat lab down removes it"
			if !st.Detached {
				how = "it is removed when that process ends"
			}
			out = append(out, fmt.Sprintf("kept lab %s: its process %d still runs (%s; clean --force removes it anyway)", n, st.Owner.PID, how))
			continue
		}
		l := &Lab{st: st, dir: dir}
		if err := l.destroy(); err != nil {
			errs = append(errs, fmt.Errorf("lab %s: %w", n, err))
			continue
		}
		out = append(out, fmt.Sprintf("removed lab %s (%d namespaces)", n, len(st.Topology.Namespaces())))
	}
	if len(out) == 0 && len(errs) == 0 {
		out = append(out, "nothing to clean")
	}
	return out, errors.Join(errs...)
}

// cleanUnrecorded handles a named lab without state: namespaces named
// after it are removed only when forced (they may be another tool's).
func cleanUnrecorded(name string, force bool) (string, error) {
	found, err := netns.List(name + "-")
	if err != nil {
		return "", err
	}
	if len(found) == 0 {
		return fmt.Sprintf("no lab %s", name), nil
	}
	if !force {
		return fmt.Sprintf("no lab %s, but %d namespaces are named %s-*; no lab state describes them, so --force is needed to remove them", name, len(found), name), nil
	}
	var errs []error
	for _, n := range found {
		if err := netns.Delete(n); err != nil {
			errs = append(errs, err)
		}
	}
	return fmt.Sprintf("removed %d namespaces named %s-*", len(found), name), errors.Join(errs...)
}
