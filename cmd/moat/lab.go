package main

import (
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
)

// exitDisagree is the status of a lab run in which the kernel and the
// evaluator disagree on some flow.
const exitDisagree = 3

// newLabCommand is `moat lab`: pods as network namespaces on this machine,
// policies enforced by the agent's nftables code, real packets.
func newLabCommand() *cobra.Command {
	c := &cobra.Command{
		Use:   "lab",
		Short: "Enforce policies with real nftables in network namespaces and probe with real packets (needs root)",
		Long: `lab builds the input's nodes and pods as Linux network namespaces on this
machine: a namespace per node routing for its pods, a namespace per pod with
the pod's addresses, host-network pods in their node's namespace, and an
"outside" namespace holding the --peer addresses. Each node namespace gets the
nftables rules the agent would program on that node. Every pod answers on its
ports (TCP and UDP); probes measure every flow of the matrix and compare it
with the evaluator. SCTP cannot be probed on this kernel: such flows are
reported with "measured": false and judged from the programmed rules.

Nothing is added to the machine's own network namespace. The lab needs root
and the nft binary (Debian: apt-get install nftables).

  moat lab run      build, measure, compare, tear down (exit 0 agree, 3 disagree, 1 error)
  moat lab up       build a lab that stays up; apply, probe and down work on it
  moat lab clean    remove labs whose process is gone (a crashed run, a killed up)`,
	}
	c.AddCommand(newLabRunCommand(), newLabUpCommand(), newLabApplyCommand(), newLabProbeCommand(),
		newLabDownCommand(), newLabCleanCommand(), newLabServeCommand())
	return c
}

// labFlags are the flags of commands that build or measure.
type labFlags struct {
	ports, peers []string
	output       string
	parallel     int
	timeout      time.Duration
	cutDenied    bool
	name         string
}

func (f *labFlags) registerMatrix(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.ports, "port", nil, "port to probe, N or N/PROTO (repeatable; default: every container port)")
	cmd.Flags().StringArrayVar(&f.peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
}

func (f *labFlags) registerProbe(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "table or json")
	cmd.Flags().IntVar(&f.parallel, "parallel", 64, "probes in flight at once")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 800*time.Millisecond, "how long a probe waits before calling the flow dropped")
}

func (f *labFlags) registerName(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&f.name, "lab", "", what)
}

func (f *labFlags) options() (lab.Options, error) {
	opts, err := parseMatrixOptions(f.ports, f.peers)
	if err != nil {
		return lab.Options{}, err
	}
	return lab.Options{Peers: opts.Peers, Ports: opts.Ports, CutDenied: f.cutDenied}, nil
}

func (f *labFlags) probeOptions() (lab.ProbeOptions, error) {
	if f.output != "table" && f.output != "json" {
		return lab.ProbeOptions{}, fmt.Errorf("-o: must be table or json, got %q", f.output)
	}
	if f.parallel < 1 {
		return lab.ProbeOptions{}, fmt.Errorf("--parallel: must be at least 1, got %d", f.parallel)
	}
	if f.timeout <= 0 {
		return lab.ProbeOptions{}, fmt.Errorf("--timeout: must be positive, got %s", f.timeout)
	}
	return lab.ProbeOptions{Parallel: f.parallel, Timeout: f.timeout}, nil
}

// signalContext ends on Ctrl-C or SIGTERM, so labs are torn down.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	return signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
}

// failed wraps an error for exit status 1.
func failed(err error) error {
	var ee *exitError
	if err == nil || errors.As(err, &ee) {
		return err
	}
	return &exitError{1, err}
}

func newLabRunCommand() *cobra.Command {
	var (
		in inputFlags
		lf labFlags
	)
	cmd := &cobra.Command{
		Use:   "run -f FILE... [--port N/PROTO]... [--peer IP]... [-o table|json]",
		Short: "Build a lab, measure every flow with real packets, compare with the evaluator, tear down",
		Long: `run builds the lab, programs every node, probes every flow of the matrix in
parallel, prints the measured matrix and tears everything down, also on
Ctrl-C. A flow is allowed only when the destination's reply comes back; it is
denied when the kernel reports the drop of exactly this probe's packet by a
policy rule (outcome "dropped", with the node and chain), when the sender's
own namespace refuses it, or when no reply comes within --timeout twice (the
second time four times longer). See docs/lab.md. A namespace that cannot be
removed is a warning: it changes neither the measured flows nor the exit
status.
Exit status: 0 when every flow agrees with the evaluator, 3 when some flow
disagrees (they are listed), 1 on error. -o json prints the moat matrix
schema with "measured", "predicted" and "agree" per flow.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := lf.options()
			if err != nil {
				return failed(err)
			}
			popts, err := lf.probeOptions()
			if err != nil {
				return failed(err)
			}
			if err := lab.CheckHost(); err != nil {
				return failed(err)
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := lab.Run(ctx, prog, opts, popts)
			if err != nil && ctx.Err() != nil {
				return failed(fmt.Errorf("interrupted; the lab was torn down: %w", err))
			}
			if err != nil {
				return failed(err)
			}
			return writeReport(cmd, rep, lf.output)
		},
	}
	in.register(cmd)
	lf.registerMatrix(cmd)
	lf.registerProbe(cmd)
	return cmd
}

// writeReport prints a measured matrix and its summary, and returns exit
// status 3 when some flow disagrees.
func writeReport(cmd *cobra.Command, rep *lab.Report, format string) error {
	write := rep.WriteTable
	if format == "json" {
		write = rep.WriteJSON
	}
	if err := write(cmd.OutOrStdout()); err != nil {
		return failed(err)
	}
	rep.WriteSummary(cmd.ErrOrStderr())
	if n := len(rep.Disagreements()); n > 0 {
		return &exitError{exitDisagree, fmt.Errorf("%d flows disagree with the evaluator", n)}
	}
	return nil
}

// snapshotFunc copies the input the way inputFlags.load reads it.
func (f *inputFlags) snapshotFunc(stdin io.Reader) func(dir string) error {
	return func(dir string) error {
		if len(f.files) == 0 {
			return lab.SnapshotFS(dir, examples.FS, examples.Quickstart)
		}
		return lab.SnapshotFiles(dir, f.files, stdin)
	}
}

// bufferStdin lets -f - be read twice: once to compile, once to copy.
// It also refuses a live cluster as input: up and apply keep a copy of
// their input, which is only done for files yet.
func bufferStdin(cmd *cobra.Command, in *inputFlags) error {
	if in.isLive() {
		return errors.New("lab up and apply keep a copy of their input for later commands, which works for files only: save the cluster (kubectl get -A -o yaml namespaces,nodes,pods,networkpolicies,clusternetworkpolicies) and pass it with -f; lab run reads a live cluster")
	}
	for _, p := range in.files {
		if p == "-" {
			b, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			cmd.SetIn(&replayReader{data: b})
			return nil
		}
	}
	return nil
}

// replayReader reads the same bytes again after reaching the end once.
type replayReader struct {
	data []byte
	off  int
}

func (r *replayReader) Read(p []byte) (int, error) {
	if r.off >= len(r.data) {
		r.off = 0
		return 0, io.EOF
	}
	n := copy(p, r.data[r.off:])
	r.off += n
	return n, nil
}

func newLabUpCommand() *cobra.Command {
	var (
		in inputFlags
		lf labFlags
	)
	cmd := &cobra.Command{
		Use:   "up -f FILE... [--port N/PROTO]... [--peer IP]...",
		Short: "Build a lab that stays up (explore it with ip netns exec; change it with lab apply)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := lf.options()
			if err != nil {
				return failed(err)
			}
			if err := lab.CheckHost(); err != nil {
				return failed(err)
			}
			if err := bufferStdin(cmd, &in); err != nil {
				return failed(err)
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return failed(fmt.Errorf("find the moat binary for the responder process: %w", err))
			}
			opts.Server = []string{exe, "lab", "serve"}
			opts.Snapshot = in.snapshotFunc(cmd.InOrStdin())
			ctx, stop := signalContext(cmd)
			defer stop()
			l, err := lab.Up(ctx, prog, opts)
			if err != nil {
				return failed(err)
			}
			defer l.Close()
			l.Describe(cmd.OutOrStdout())
			return nil
		},
	}
	in.register(cmd)
	lf.registerMatrix(cmd)
	cmd.Flags().BoolVar(&lf.cutDenied, "cut-denied-established", true, "remove established connections that updated rules deny (conntrack)")
	return cmd
}

// openLab finds a running lab for apply, probe and down.
func openLab(cmd *cobra.Command, name string) (*lab.Lab, context.Context, context.CancelFunc, error) {
	ctx, stop := signalContext(cmd)
	l, err := lab.Open(ctx, name)
	if err != nil {
		stop()
		return nil, nil, nil, failed(err)
	}
	return l, ctx, stop, nil
}

func newLabApplyCommand() *cobra.Command {
	var (
		in inputFlags
		lf labFlags
	)
	cmd := &cobra.Command{
		Use:   "apply [--lab NAME] -f FILE...",
		Short: "Program a running lab with changed policies or labels (the pods and addresses must stay)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bufferStdin(cmd, &in); err != nil {
				return failed(err)
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			l, ctx, stop, err := openLab(cmd, lf.name)
			if err != nil {
				return err
			}
			defer stop()
			defer l.Close()
			results, err := l.Apply(ctx, prog, in.snapshotFunc(cmd.InOrStdin()))
			if err != nil {
				return failed(err)
			}
			for i, r := range results {
				fmt.Fprintf(cmd.OutOrStdout(), "node %s: %d operations, %d chains, %d rules, %d sets, %d elements\n",
					l.Topology().Nodes[i].Name, r.Operations, r.Stats.Chains, r.Stats.Rules, r.Stats.Sets, r.Stats.Elements)
				for _, w := range r.Warnings {
					fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
				}
			}
			return nil
		},
	}
	in.register(cmd)
	lf.registerName(cmd, "the lab (default: the only one running)")
	return cmd
}

func newLabProbeCommand() *cobra.Command {
	var lf labFlags
	cmd := &cobra.Command{
		Use:   "probe [--lab NAME] [-o table|json]",
		Short: "Measure every flow of a running lab and compare with the evaluator (exit 0 agree, 3 disagree)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			popts, err := lf.probeOptions()
			if err != nil {
				return failed(err)
			}
			l, ctx, stop, err := openLab(cmd, lf.name)
			if err != nil {
				return err
			}
			defer stop()
			defer l.Close()
			rep, err := l.Measure(ctx, popts)
			if err != nil {
				return failed(err)
			}
			return writeReport(cmd, rep, lf.output)
		},
	}
	lf.registerProbe(cmd)
	lf.registerName(cmd, "the lab (default: the only one running)")
	return cmd
}

func newLabDownCommand() *cobra.Command {
	var lf labFlags
	cmd := &cobra.Command{
		Use:   "down [--lab NAME]",
		Short: "Tear a running lab down",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, _, stop, err := openLab(cmd, lf.name)
			if err != nil {
				return err
			}
			defer stop()
			if err := l.Down(); err != nil {
				return failed(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s removed\n", l.Name())
			return nil
		},
	}
	lf.registerName(cmd, "the lab (default: the only one running)")
	return cmd
}

func newLabCleanCommand() *cobra.Command {
	var (
		lf    labFlags
		force bool
	)
	cmd := &cobra.Command{
		Use:   "clean [--lab NAME] [--force]",
		Short: "Remove labs whose process is gone: responder processes, namespaces, state",
		Long: `clean removes what labs left behind when their process died (a crashed or
killed lab run, a lab up killed while building, a lab whose responder process
ended): their namespaces, responder process and state. A lab whose process
still runs is kept unless --force. Namespaces that no lab recorded are never
removed, whatever their name, except those named after --lab with --force.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			msgs, err := lab.Clean(lf.name, force)
			for _, m := range msgs {
				fmt.Fprintln(cmd.OutOrStdout(), m)
			}
			if len(msgs) == 0 && err == nil {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to clean")
			}
			return failed(err)
		},
	}
	lf.registerName(cmd, "only this lab (default: every lab)")
	cmd.Flags().BoolVar(&force, "force", false, "also remove labs whose process still runs")
	return cmd
}

// newLabServeCommand is the responder process `lab up` starts; it is not
// meant to be run by hand.
func newLabServeCommand() *cobra.Command {
	var lf labFlags
	cmd := &cobra.Command{
		Use:    "serve --lab NAME",
		Short:  "Answer on every port of a running lab (started by lab up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lf.name == "" {
				return failed(errors.New("--lab is required"))
			}
			l, ctx, stop, err := openLab(cmd, lf.name)
			if err != nil {
				return err
			}
			defer stop()
			defer l.Close()
			return failed(l.Serve(ctx, cmd.OutOrStdout()))
		},
	}
	lf.registerName(cmd, "the lab")
	return cmd
}
