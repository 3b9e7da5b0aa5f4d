package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/lab"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
)

// newLabCommand is `moat lab`: pods as network namespaces, the agent's
// nftables rules, real packets (docs/lab.md).
func newLabCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "lab",
		Short: "Enforce policies with real nftables in network namespaces and probe with real packets (needs root)",
		Long: `lab builds the input's nodes and pods as network namespaces on this
machine, programs each node with the agent's nftables rules and measures
every flow of the matrix with real TCP and UDP packets against the evaluator
(docs/lab.md). Needs root and nft; the machine's own namespace is not touched.`,
	}
	run := labCommand("run [-f FILE... | --live] [--port N/PROTO]... [--peer IP]... [-o table|json]",
		"Build a lab, measure every flow with real packets, compare with the evaluator, tear down", "imp", labRun)
	run.Long = `run builds a lab, measures every flow in parallel, prints the measured matrix
and tears the lab down, also on Ctrl-C. Allowed means the destination's reply
came back; denied, that the kernel reported this probe's packet dropped by a
policy rule ("dropped", with node and chain), that the sender's namespace
refused it, or that no reply came twice (docs/lab.md). Teardown problems are
warnings. Exit status: 0 every flow agrees with the evaluator, 3 some
disagree, 1 error. -o json adds "measured", "predicted", "agree", "outcome".
Without -f and a live cluster, the embedded quickstart example is read with
the ports and peers of its matrix.args, as moat matrix reads it.`
	clean := labCommand("clean [--lab NAME] [--force]", "Remove labs whose process is gone (a crashed run, a killed up; --force: also live ones), never namespaces no lab made", "nf", labClean)
	serve := labCommand("serve --lab NAME", "Answer on every port of a running lab (the process lab up starts)", "n", labServe)
	serve.Hidden = true
	_ = serve.MarkFlagRequired("lab")
	up := labCommand("up [-f FILE...] [--port N/PROTO]... [--peer IP]...",
		"Build a lab that stays up (explore it with ip netns exec; change it with lab apply)", "imc", labUp)
	up.Long = `up builds a lab as run does and leaves it up: explore it with ip netns exec,
measure it with lab probe, change it with lab apply, remove it with lab down.
It reads files only (-f); without -f, the embedded quickstart example with
the ports and peers of its matrix.args, as moat matrix reads it.`
	apply := labCommand("apply [--lab NAME] [-f FILE...]",
		"Program a running lab with changed policies or labels (the pods and addresses must stay)", "in", labApply)
	for _, c := range []*cobra.Command{up, apply} {
		c.Annotations = map[string]string{filesOnly: "true"}
		// Not offered in --help, since they always refuse; still
		// registered, so that --live says why (snapshot) instead of
		// "unknown flag", and the plugin can turn it on.
		for _, name := range []string{"live", "kubeconfig", "context"} {
			_ = c.Flags().MarkHidden(name)
		}
	}
	c.AddCommand(run, clean, serve, up, apply,
		labCommand("probe [--lab NAME] [-o table|json]",
			"Measure every flow of a running lab and compare with the evaluator (exit 0 agree, 3 disagree)", "pn", labProbe),
		labCommand("down [--lab NAME]", "Tear a running lab down", "n", labDown))
	return c
}

// filesOnly marks the commands that read files only (see snapshot): as
// the kubectl plugin, they do not read the live cluster when given -f.
const filesOnly = "moat.files-only"

// labFlags are the lab commands' flags.
type labFlags struct {
	in           inputFlags
	ports, peers []string
	output, name string
	parallel     int
	timeout      time.Duration
	cutDenied    bool
	force        bool // clean: also labs whose process runs
}

// labCommand makes a lab subcommand; flags picks the flag groups: i
// input, m --port and --peer, p probing, n --lab, c
// --cut-denied-established, f --force. Errors exit with status 1; run
// gets a context that Ctrl-C and SIGTERM end.
func labCommand(use, short, flags string, run func(context.Context, *cobra.Command, *labFlags) error) *cobra.Command {
	f := &labFlags{}
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error {
		// Ctrl-C and SIGTERM end the context, so labs are torn down.
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err := run(ctx, cmd, f)
		if ee := (*exitError)(nil); err == nil || errors.As(err, &ee) {
			return err
		}
		return &exitError{1, err}
	}}
	fl := cmd.Flags()
	for _, g := range flags {
		switch g {
		case 'i':
			f.in.noNamespaceFlag = true // the lab's copies are read again without it
			f.in.register(cmd)
		case 'm':
			fl.StringArrayVar(&f.ports, "port", nil, "port to probe, N or N/PROTO (repeatable; default: every container port)")
			fl.StringArrayVar(&f.peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
		case 'p':
			fl.StringVarP(&f.output, "output", "o", "table", "table or json")
			fl.IntVar(&f.parallel, "parallel", 64, "probes in flight at once (0: the default)")
			fl.DurationVar(&f.timeout, "timeout", 800*time.Millisecond, "how long a probe waits for a reply when the kernel reports no drop")
		case 'n':
			fl.StringVar(&f.name, "lab", "", "the lab (default: the only one running; for clean: every lab)")
		case 'c':
			fl.BoolVar(&f.cutDenied, "cut-denied-established", true, "remove established connections that updated rules deny (conntrack)")
		case 'f':
			fl.BoolVar(&f.force, "force", false, "also remove labs whose process still runs")
		}
	}
	return cmd
}

// options checks the flags and returns the lab's and the probes' options.
func (f *labFlags) options() (lab.Options, lab.ProbeOptions, error) {
	m, err := parseMatrixOptions(f.ports, f.peers)
	switch {
	case err != nil:
	case f.output != "table" && f.output != "json" && f.output != "":
		err = fmt.Errorf("-o: must be table or json, got %q", f.output)
	case f.parallel < 0 || f.timeout < 0:
		err = fmt.Errorf("--parallel %d, --timeout %s: must not be negative", f.parallel, f.timeout)
	}
	return lab.Options{Peers: m.Peers, Ports: m.Ports, CutDenied: f.cutDenied}, lab.ProbeOptions{Parallel: f.parallel, Timeout: f.timeout}, err
}

// snapshot reads stdin once, so that -f - can be compiled and then
// copied, and returns what copies the input for lab up and apply. A live
// cluster is refused: its copy works for files only yet.
func (f *labFlags) snapshot(cmd *cobra.Command) (func(dir string) error, error) {
	if f.in.isLive() {
		return nil, errors.New("lab up and apply keep a copy of their input for later commands, which works for files only: save the cluster (kubectl get -A -o yaml namespaces,nodes,pods,networkpolicies,clusternetworkpolicies) and pass it with -f; lab run reads a live cluster")
	}
	if len(f.in.files) == 0 {
		return lab.Manifests(examples.FS, nil, examples.Quickstart), nil
	}
	b, err := io.ReadAll(cmd.InOrStdin())
	if err != nil {
		return nil, fmt.Errorf("read stdin: %w", err)
	}
	stdin := bytes.NewReader(b)
	cmd.SetIn(stdin)
	return lab.Manifests(nil, stdin, f.in.files...), nil
}

// compile loads and compiles the input as inputFlags.compile does; the
// embedded example (no -f, no live cluster) comes with the ports, peers
// and gates of its matrix.args unless --port or --peer is given, as in
// moat matrix.
func (f *labFlags) compile(cmd *cobra.Command, opts *lab.Options) (*policy.Program, error) {
	l, err := f.in.load(cmd)
	if err != nil {
		return nil, err
	}
	m := matrix.Options{Ports: opts.Ports, Peers: opts.Peers}
	if err := f.in.exampleArgs(cmd, l, &m, f.ports, f.peers); err != nil {
		return nil, err
	}
	opts.Ports, opts.Peers = m.Ports, m.Peers
	return f.in.compileLoaded(cmd, l.Result)
}

// writeReport prints a measured matrix and its summary; some flow on
// which the kernel and the evaluator disagree makes the exit status 3.
func writeReport(cmd *cobra.Command, rep *lab.Report, format string) error {
	if err := rep.Write(cmd.OutOrStdout(), cmd.ErrOrStderr(), format); err != nil {
		return err
	}
	if n := len(rep.Disagreements()); n > 0 {
		return &exitError{3, fmt.Errorf("%d flows disagree with the evaluator", n)}
	}
	return nil
}

func labRun(ctx context.Context, cmd *cobra.Command, f *labFlags) error {
	opts, popts, err := f.options()
	if err != nil {
		return err
	}
	prog, err := f.compile(cmd, &opts)
	if err != nil {
		return err
	}
	rep, err := lab.Run(ctx, prog, opts, popts)
	if err != nil {
		return err
	}
	return writeReport(cmd, rep, f.output)
}

func labUp(ctx context.Context, cmd *cobra.Command, f *labFlags) error {
	opts, _, err := f.options()
	if err != nil {
		return err
	}
	if opts.Snapshot, err = f.snapshot(cmd); err != nil {
		return err
	}
	prog, err := f.compile(cmd, &opts)
	if err != nil {
		return err
	}
	opts.Server = []string{"lab", "serve"}
	l, err := lab.Up(ctx, prog, opts)
	if err != nil {
		return err
	}
	defer l.Close()
	l.Describe(cmd.OutOrStdout())
	return nil
}

// withLab opens a running lab for apply, probe, down and serve.
func withLab(ctx context.Context, f *labFlags, do func(*lab.Lab) error) error {
	l, err := lab.Open(ctx, f.name)
	if err != nil {
		return err
	}
	defer l.Close()
	return do(l)
}

func labApply(ctx context.Context, cmd *cobra.Command, f *labFlags) error {
	snapshot, err := f.snapshot(cmd)
	if err != nil {
		return err
	}
	prog, err := f.in.compile(cmd)
	if err != nil {
		return err
	}
	return withLab(ctx, f, func(l *lab.Lab) error {
		results, err := l.Apply(ctx, prog, snapshot)
		l.WriteResults(cmd.OutOrStdout(), results)
		return err
	})
}

func labProbe(ctx context.Context, cmd *cobra.Command, f *labFlags) error {
	_, popts, err := f.options()
	if err != nil {
		return err
	}
	return withLab(ctx, f, func(l *lab.Lab) error {
		rep, err := l.Measure(ctx, popts)
		if err != nil {
			return err
		}
		return writeReport(cmd, rep, f.output)
	})
}

func labDown(ctx context.Context, cmd *cobra.Command, f *labFlags) error {
	return withLab(ctx, f, func(l *lab.Lab) error {
		if err := l.Down(); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "lab %s removed\n", l.Name())
		return nil
	})
}

func labClean(_ context.Context, cmd *cobra.Command, f *labFlags) error {
	msgs, err := lab.Clean(f.name, f.force)
	for _, m := range msgs {
		fmt.Fprintln(cmd.OutOrStdout(), m)
	}
	return err
}

func labServe(ctx context.Context, cmd *cobra.Command, f *labFlags) error {
	return withLab(ctx, f, func(l *lab.Lab) error {
		return l.Serve(ctx, cmd.OutOrStdout())
	})
}
