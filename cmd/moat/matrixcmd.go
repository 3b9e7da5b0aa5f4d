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
	)
	cmd := &cobra.Command{
		Use:   "matrix [-f FILE... | --live] [--port N/PROTO]... [--peer IP]... [-n NAMESPACE]... [-o table|json|html]",
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
matrix.args.`,
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
			if l.Example != "" && len(ports) == 0 && len(peers) == 0 {
				args, err := examples.ReadArgs(l.Example)
				if err != nil {
					return err
				}
				opts.Ports, opts.Peers = args.Matrix.Ports, args.Matrix.Peers
				if args.FeatureGates != "" && !cmd.Flags().Changed("feature-gates") {
					if err := in.gates.Set(args.FeatureGates); err != nil {
						return err
					}
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "ports and peers: the example's matrix.args (%s)\n", describeArgs(args))
			}
			prog, err := in.compileLoaded(cmd, l.Result)
			if err != nil {
				return err
			}
			res, err := matrix.Build(prog, opts)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				return matrix.WriteJSON(cmd.OutOrStdout(), res)
			case "html":
				return matrix.WriteHTML(cmd.OutOrStdout(), res)
			}
			return matrix.WriteTable(cmd.OutOrStdout(), res)
		},
	}
	in.register(cmd)
	cmd.Flags().StringArrayVar(&ports, "port", nil, "port to judge, N or N/PROTO (repeatable; default: every container port)")
	cmd.Flags().StringArrayVar(&peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
	cmd.Flags().StringSliceVarP(&namespaces, "namespace", "n", nil, "only the pods of these namespaces (repeatable or comma-separated; default: all)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or html")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "html"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
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
