// Command moat-proxy-agent is the node side of Moat's konnectivity-compatible
// tunnel. See docs/tunnel.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/logging"
)

func main() {
	opts, err := agent.NewOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var logOpts logging.Options
	cmd := &cobra.Command{
		Use:           "moat-proxy-agent",
		Short:         "konnectivity-compatible proxy agent with node-to-control-plane traffic (KEP-2025)",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.New(os.Stderr)
			if err != nil {
				return err
			}
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(sigs)
			return opts.Run(cmd.Context(), log, sigs)
		},
	}
	opts.AddFlags(cmd.Flags())
	logOpts.AddFlags(cmd.Flags())
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "moat-proxy-agent:", err)
		os.Exit(1)
	}
}
