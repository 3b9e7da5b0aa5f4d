package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/matrix"
)

func newMatrixCommand() *cobra.Command {
	var (
		in     inputFlags
		ports  []string
		peers  []string
		output string
	)
	cmd := &cobra.Command{
		Use:   "matrix -f FILE... [--port N/PROTO]... [--peer IP]... [-o table|json|html]",
		Short: "Print the connectivity matrix of every pod (and peer) on every port",
		Long: `matrix judges every ordered pair of endpoints - every pod of the input,
host-network pods included, plus each --peer address - on every port: the
--port values, or every distinct container port of the input. Rows are
sources, columns destinations. -o json gives each flow with both directions'
explanations; -o html is one self-contained page with explanations on hover.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := parseMatrixOptions(ports, peers)
			if err != nil {
				return &exitError{1, err}
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			res, err := matrix.Build(prog, opts)
			if err != nil {
				return &exitError{1, err}
			}
			switch output {
			case "table", "":
				return matrix.WriteTable(cmd.OutOrStdout(), res)
			case "json":
				return matrix.WriteJSON(cmd.OutOrStdout(), res)
			case "html":
				return matrix.WriteHTML(cmd.OutOrStdout(), res)
			}
			return &exitError{1, fmt.Errorf("-o: must be table, json or html, got %q", output)}
		},
	}
	in.register(cmd)
	cmd.Flags().StringArrayVar(&ports, "port", nil, "port to judge, N or N/PROTO (repeatable; default: every container port)")
	cmd.Flags().StringArrayVar(&peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or html")
	return cmd
}

// parseMatrixOptions turns --port and --peer values into matrix options,
// naming the flag in errors.
func parseMatrixOptions(ports, peers []string) (matrix.Options, error) {
	var opts matrix.Options
	for _, p := range ports {
		pp, err := matrix.ParsePortProto(p)
		if err != nil {
			return opts, fmt.Errorf("--port: %w", err)
		}
		opts.Ports = append(opts.Ports, pp)
	}
	for _, p := range peers {
		a, err := netip.ParseAddr(p)
		if err != nil {
			return opts, fmt.Errorf("--peer %q: not an IP address", p)
		}
		opts.Peers = append(opts.Peers, a.Unmap())
	}
	return opts, nil
}
