package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/matrix"
)

func newMatrixCommand() *cobra.Command {
	var (
		in         = inputFlags{noNamespaceFlag: true} // -n filters here
		ports      []string
		peers      []string
		namespaces []string
		output     string
		maxEps     int
	)
	cmd := &cobra.Command{
		Use:   "matrix [-f FILE... | --live] [--port N/PROTO]... [--peer IP]... [-n NAMESPACE]... [-o table|json|html] [--max-endpoints N]",
		Short: "Print the connectivity matrix of every pod (and peer) on every port",
		Long: `matrix judges every ordered pair of endpoints - every pod of the input,
host-network pods included, plus each --peer address - on every port: the
--port values, or every distinct container port of the input. Rows are
sources, columns destinations. -n keeps only the pods of the given
namespaces (the whole snapshot is still read: policies elsewhere decide too).
-o json gives each flow with both directions' explanations; -o html is one
self-contained page: a namespace-by-namespace summary with drill-down to
pods, a filter, and each cell's explanation. Without -f and a live cluster,
the embedded quickstart example is read with the ports and peers of its
matrix.args.

Cells are judged as they are printed, and endpoints the policies cannot
tell apart are judged once, so memory grows with the endpoints, not with
the cells. The output still grows with the square of the endpoints: past
--max-endpoints (default 2000) matrix refuses, saying how large the output
would be; narrow it with -n and --port, or pass --max-endpoints 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := matrix.ParseOptions(ports, peers)
			if err != nil {
				return err
			}
			opts.Namespaces = namespaces
			switch output {
			case "table", "", "json", "html":
			default:
				return fmt.Errorf("-o: must be table, json or html, got %q", output)
			}
			l, err := in.load(cmd)
			if err != nil {
				return err
			}
			if err := in.exampleArgs(cmd, l, &opts, ports, peers); err != nil {
				return err
			}
			prog, err := in.compileLoaded(cmd, l.Result)
			if err != nil {
				return err
			}
			m, err := matrix.New(prog, opts)
			if err != nil {
				return err
			}
			if err := checkMatrixSize(m, maxEps); err != nil {
				return err
			}
			switch output {
			case "json":
				return m.WriteJSON(cmd.OutOrStdout())
			case "html":
				return m.WriteHTML(cmd.OutOrStdout())
			}
			return m.WriteTable(cmd.OutOrStdout())
		},
	}
	in.register(cmd)
	cmd.Flags().StringArrayVar(&ports, "port", nil, "port to judge, N or N/PROTO (repeatable; default: every container port)")
	cmd.Flags().StringArrayVar(&peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
	cmd.Flags().StringSliceVarP(&namespaces, "namespace", "n", nil, "only the pods of these namespaces (repeatable or comma-separated; default: all)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or html")
	cmd.Flags().IntVar(&maxEps, "max-endpoints", defaultMaxEndpoints, "refuse a matrix of more endpoints (pods and peers) than this; 0: no limit")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "html"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// defaultMaxEndpoints bounds what a bare `kubectl moat matrix` prints: 2,000
// endpoints make a table of 4 million cells per port (about 20 MB of text
// per port) and a JSON of several GB per port, more than anyone reads; a
// whole cluster of 100,000 pods would be 10^10 cells per port. Refusing
// with the sizes and the way to narrow it beats running for hours.
const defaultMaxEndpoints = 2000

// checkMatrixSize refuses a matrix of more than max endpoints (0: any).
func checkMatrixSize(m *matrix.Matrix, limit int) error {
	n := m.Endpoints()
	if limit <= 0 || n <= limit {
		return nil
	}
	cells := int64(n) * int64(n)
	return fmt.Errorf("%d endpoints (in %d classes the policies tell apart) make %d cells on each of %d port(s), a table of about %s, more than --max-endpoints %d allows: "+
		"narrow the matrix with -n NAMESPACE (the policies of every namespace still apply) and --port N/PROTO, or pass --max-endpoints 0 to print it all",
		n, m.Classes(), cells, len(m.Ports()), humanBytes(m.TableSize()), limit)
}

// humanBytes is a size in the largest unit that keeps it at 1 or more.
func humanBytes(b int64) string {
	f, unit := float64(b), "bytes"
	for _, u := range []string{"KB", "MB", "GB", "TB"} {
		if f < 1000 {
			break
		}
		f, unit = f/1000, u
	}
	if unit == "bytes" {
		return fmt.Sprintf("%d bytes", b)
	}
	return fmt.Sprintf("%.1f %s", f, unit)
}

// exampleArgs gives the embedded example its matrix.args when l is that
// example and neither --port nor --peer was given: its ports, its peers and,
// unless --feature-gates was given, its gates, and says so on stderr. matrix,
// lab run and lab up all call it, so that with no input they judge the same
// endpoints (the example's matrix.golden) instead of one copy of the
// arguments per command.
func (f *inputFlags) exampleArgs(cmd *cobra.Command, l *loaded, opts *matrix.Options, ports, peers []string) error {
	if l.Example == "" || len(ports) > 0 || len(peers) > 0 {
		return nil
	}
	args, err := examples.ReadArgs(l.Example)
	if err != nil {
		return err
	}
	opts.Ports, opts.Peers = args.Matrix.Ports, args.Matrix.Peers
	if args.FeatureGates != "" && !cmd.Flags().Changed("feature-gates") {
		// Through the flag's value, which refuses what the flag refuses
		// (without marking the flag given).
		if err := cmd.Flags().Lookup("feature-gates").Value.Set(args.FeatureGates); err != nil {
			return fmt.Errorf("%s/matrix.args: %w", l.Example, err)
		}
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "ports and peers: the example's matrix.args (%s)\n", describeArgs(args))
	return nil
}

// describeArgs prints matrix options as flags.
func describeArgs(a examples.Args) string {
	s := ""
	for _, p := range a.Matrix.Ports {
		s += " --port " + p.String()
	}
	for _, p := range a.Matrix.Peers {
		s += " --peer " + p.String()
	}
	if a.FeatureGates != "" {
		s += " --feature-gates " + a.FeatureGates
	}
	if s == "" {
		return "none"
	}
	return s[1:]
}

// parseMatrixOptions reads --port and --peer values (moat lab's commands
// call it).
func parseMatrixOptions(ports, peers []string) (matrix.Options, error) {
	return matrix.ParseOptions(ports, peers)
}
