// Command moat-proxy-server is the control-plane side of Moat's
// konnectivity-compatible tunnel. See docs/tunnel.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/tunnel/logging"
	"github.com/moat-net/moat/tunnel/server"
)

func main() {
	opts, err := server.NewOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var logOpts logging.Options
	cmd := &cobra.Command{
		Use:           "moat-proxy-server",
		Short:         "konnectivity-compatible proxy server with node-to-control-plane traffic (KEP-2025)",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.New(os.Stderr)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return opts.Run(ctx, log)
		},
	}
	opts.AddFlags(cmd.Flags())
	logOpts.AddFlags(cmd.Flags())
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "moat-proxy-server:", err)
		os.Exit(1)
	}
}
