package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/lab"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
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
  moat lab clean    remove whatever crashed runs left behind`,
	}
	c.AddCommand(newLabRunCommand(), newLabUpCommand(), newLabApplyCommand(), newLabProbeCommand(),
		newLabDownCommand(), newLabCleanCommand(), newLabServeCommand())
	return c
}

// labFlags are the flags of commands that measure.
type labFlags struct {
	ports, peers []string
	output       string
	parallel     int
	timeout      time.Duration
	cutDenied    bool
}

func (f *labFlags) registerMatrix(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.ports, "port", nil, "port to probe, N or N/PROTO (repeatable; default: every container port)")
	cmd.Flags().StringArrayVar(&f.peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
}

func (f *labFlags) registerProbe(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "table or json")
	cmd.Flags().IntVar(&f.parallel, "parallel", 32, "probes in flight at once")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 800*time.Millisecond, "how long a probe waits before calling the flow dropped")
}

func (f *labFlags) registerCut(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.cutDenied, "cut-denied-established", true, "remove established connections that updated rules deny (conntrack)")
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

func newLabRunCommand() *cobra.Command {
	var (
		in inputFlags
		lf labFlags
	)
	cmd := &cobra.Command{
		Use:   "run -f FILE... [--port N/PROTO]... [--peer IP]... [-o table|json]",
		Short: "Build a lab, measure every flow with real packets, compare with the evaluator, tear down",
		Long: `run builds the lab, programs every node, probes every flow of the matrix in
parallel (bounded, with a short timeout; flows that time out although the
evaluator allows them are probed again, slower), prints the measured matrix
and tears everything down, also on Ctrl-C. Exit status: 0 when every flow
agrees with the evaluator, 3 when some flow disagrees (they are listed), 1 on
error. -o json prints the moat matrix schema with "measured", "predicted" and
"agree" per flow.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := parseMatrixOptions(lf.ports, lf.peers)
			if err != nil {
				return &exitError{1, err}
			}
			popts, err := lf.probeOptions()
			if err != nil {
				return &exitError{1, err}
			}
			if err := lab.CheckHost(); err != nil {
				return &exitError{1, err}
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := lab.Run(ctx, prog, lab.Options{Peers: opts.Peers, Ports: opts.Ports, CutDenied: lf.cutDenied}, popts)
			if err != nil {
				if ctx.Err() != nil {
					return &exitError{1, fmt.Errorf("interrupted; the lab was torn down: %w", err)}
				}
				return &exitError{1, err}
			}
			return writeReport(cmd.OutOrStdout(), cmd.ErrOrStderr(), rep, lf.output)
		},
	}
	in.register(cmd)
	lf.registerMatrix(cmd)
	lf.registerProbe(cmd)
	return cmd
}

// writeReport prints a measured matrix and returns exit status 3 when
// some flow disagrees.
func writeReport(out, errOut io.Writer, rep *lab.Report, format string) error {
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return &exitError{1, err}
		}
	} else {
		fmt.Fprintf(out, "lab %s: measured with real packets\n\n", rep.Lab)
		if err := matrix.WriteTable(out, rep.Matrix()); err != nil {
			return &exitError{1, err}
		}
	}
	measured, unmeasured := 0, 0
	reasons := map[string]int{}
	for _, f := range rep.Flows {
		if f.Measured {
			measured++
		} else {
			unmeasured++
			reasons[f.Reason]++
		}
	}
	fmt.Fprintf(errOut, "%d flows measured with real packets, %d not measured\n", measured, unmeasured)
	for r, n := range reasons {
		fmt.Fprintf(errOut, "  %d not measured: %s\n", n, r)
	}
	bad := rep.Disagreements()
	if len(bad) == 0 {
		fmt.Fprintln(errOut, "every flow agrees with the evaluator")
		return nil
	}
	tw := tabwriter.NewWriter(errOut, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DISAGREE\tFROM\tTO\tPORT\tKERNEL\tEVALUATOR\tEGRESS\tINGRESS")
	for _, f := range bad {
		kernel := verdictWord(f.Allowed)
		if f.Outcome != "" {
			kernel += " (" + f.Outcome + ")"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%d/%s\t%s\t%s\t%s\t%s\n", f.From, f.To, f.Port, f.Protocol, kernel, verdictWord(f.Predicted), f.Egress.Reason, f.Ingress.Reason)
	}
	_ = tw.Flush()
	return &exitError{exitDisagree, fmt.Errorf("%d flows disagree with the evaluator", len(bad))}
}

func verdictWord(ok bool) string {
	if ok {
		return "allowed"
	}
	return "denied"
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
func bufferStdin(cmd *cobra.Command, in *inputFlags) error {
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
			opts, err := parseMatrixOptions(lf.ports, lf.peers)
			if err != nil {
				return &exitError{1, err}
			}
			if err := lab.CheckHost(); err != nil {
				return &exitError{1, err}
			}
			if err := bufferStdin(cmd, &in); err != nil {
				return &exitError{1, err}
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			exe, err := os.Executable()
			if err != nil {
				return &exitError{1, fmt.Errorf("find the moat binary for the responder process: %w", err)}
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			st, err := lab.Create(ctx, prog, lab.CreateOptions{
				Options:  lab.Options{Peers: opts.Peers, Ports: opts.Ports, CutDenied: lf.cutDenied},
				Policy:   prog.Options,
				Snapshot: in.snapshotFunc(cmd.InOrStdin()),
				Server:   []string{exe, "lab", "serve"},
			})
			if err != nil {
				return &exitError{1, err}
			}
			printLab(cmd.OutOrStdout(), st)
			return nil
		},
	}
	in.register(cmd)
	lf.registerMatrix(cmd)
	lf.registerCut(cmd)
	return cmd
}

func printLab(w io.Writer, st *lab.State) {
	t := st.Topology
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
	fmt.Fprintf(w, "\nexplore:  ip netns exec %s nft list table inet moat\n", t.Nodes[0].NS)
	fmt.Fprintf(w, "measure:  moat lab probe --lab %s\n", t.Prefix)
	fmt.Fprintf(w, "change:   moat lab apply --lab %s -f ...\n", t.Prefix)
	fmt.Fprintf(w, "remove:   moat lab down --lab %s\n", t.Prefix)
}

func newLabApplyCommand() *cobra.Command {
	var (
		in     inputFlags
		prefix string
	)
	cmd := &cobra.Command{
		Use:   "apply [--lab PREFIX] -f FILE...",
		Short: "Program a running lab with changed policies or labels (the pods and addresses must stay)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(prefix)
			if err != nil {
				return &exitError{1, err}
			}
			if err := bufferStdin(cmd, &in); err != nil {
				return &exitError{1, err}
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			results, err := st.Apply(ctx, prog, in.snapshotFunc(cmd.InOrStdin()))
			if err != nil {
				return &exitError{1, err}
			}
			for i, r := range results {
				fmt.Fprintf(cmd.OutOrStdout(), "node %s: %d operations, %d chains, %d rules, %d sets, %d elements\n",
					st.Topology.Nodes[i].Name, r.Operations, r.Stats.Chains, r.Stats.Rules, r.Stats.Sets, r.Stats.Elements)
				for _, w := range r.Warnings {
					fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
				}
			}
			return nil
		},
	}
	in.register(cmd)
	cmd.Flags().StringVar(&prefix, "lab", "", "the lab (default: the only one running)")
	return cmd
}

// loadApplied compiles the manifests last applied to a running lab.
func loadApplied(cmd *cobra.Command, st *lab.State) (*policy.Program, error) {
	res, err := (&manifest.Loader{}).Load(st.ManifestsDir())
	if err != nil {
		return nil, err
	}
	for _, d := range res.Diagnostics {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", d.Severity, d)
	}
	if len(res.Dropped) > 0 {
		return nil, fmt.Errorf("%d object(s) of the applied manifests could not be loaded", len(res.Dropped))
	}
	return policy.Compile(&res.Cluster, st.Policy), nil
}

func newLabProbeCommand() *cobra.Command {
	var (
		lf     labFlags
		prefix string
	)
	cmd := &cobra.Command{
		Use:   "probe [--lab PREFIX] [-o table|json]",
		Short: "Measure every flow of a running lab and compare with the evaluator (exit 0 agree, 3 disagree)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			popts, err := lf.probeOptions()
			if err != nil {
				return &exitError{1, err}
			}
			st, err := lab.LoadState(prefix)
			if err != nil {
				return &exitError{1, err}
			}
			prog, err := loadApplied(cmd, st)
			if err != nil {
				return &exitError{1, err}
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := st.Measure(ctx, prog, popts)
			if err != nil {
				return &exitError{1, err}
			}
			return writeReport(cmd.OutOrStdout(), cmd.ErrOrStderr(), rep, lf.output)
		},
	}
	lf.registerProbe(cmd)
	cmd.Flags().StringVar(&prefix, "lab", "", "the lab (default: the only one running)")
	return cmd
}

func newLabDownCommand() *cobra.Command {
	var prefix string
	cmd := &cobra.Command{
		Use:   "down [--lab PREFIX]",
		Short: "Tear a running lab down",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.LoadState(prefix)
			if err != nil {
				return &exitError{1, err}
			}
			if err := lab.Destroy(st); err != nil {
				return &exitError{1, err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s removed\n", st.Topology.Prefix)
			return nil
		},
	}
	cmd.Flags().StringVar(&prefix, "lab", "", "the lab (default: the only one running)")
	return cmd
}

func newLabCleanCommand() *cobra.Command {
	var prefix string
	cmd := &cobra.Command{
		Use:   "clean [--lab PREFIX]",
		Short: `Remove everything labs left behind: namespaces named "moat-*", responder processes, state`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			removed, err := lab.Clean(prefix)
			for _, r := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", r)
			}
			if len(removed) == 0 && err == nil {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to clean")
			}
			if err != nil {
				return &exitError{1, err}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&prefix, "lab", "", "only this lab (default: every lab)")
	return cmd
}

// newLabServeCommand is the responder process `lab up` starts; it is not
// meant to be run by hand.
func newLabServeCommand() *cobra.Command {
	var prefix string
	cmd := &cobra.Command{
		Use:    "serve --lab PREFIX",
		Short:  "Answer on every port of a running lab (started by lab up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if prefix == "" {
				return &exitError{1, errors.New("--lab is required")}
			}
			st, err := lab.LoadState(prefix)
			if err != nil {
				return &exitError{1, err}
			}
			prog, err := loadApplied(cmd, st)
			if err != nil {
				return &exitError{1, err}
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			if err := lab.Serve(ctx, st, prog, cmd.OutOrStdout()); err != nil {
				return &exitError{1, err}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&prefix, "lab", "", "the lab")
	return cmd
}
