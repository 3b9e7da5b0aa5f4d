// Package daemon is the one way Moat's three daemons (moat-agent,
// moat-proxy-server, moat-proxy-agent) become commands: flags in named
// sections for --help, Validate before anything starts, component-base
// logging applied from the same flags (-v, --logging-format=json), logs
// flushed on exit, and SIGTERM/SIGINT delivered to the run loop. Each
// daemon keeps its own options (cmd/<bin>/app/options) and run loop
// (cmd/<bin>/app); what they have in common lives here once.
package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
)

// Command describes a daemon for NewCommand.
type Command struct {
	Use, Short, Long string
	// Flags are the daemon's flags in sections, bound to its options.
	Flags cliflag.NamedFlagSets
	// Validate checks the options after parsing, before logging starts;
	// it reports every problem at once, each naming its flag.
	Validate func() error
	// Logging and Features configure klog (the logging gates live in the
	// daemon's feature gate).
	Logging  *logsapi.LoggingConfiguration
	Features featuregate.FeatureGate
	// Run runs the daemon until ctx ends or it decides to stop. signals
	// receives SIGTERM and SIGINT (room for two, so a daemon that drains
	// on the first can exit at once on the second); StopOnSignal turns it
	// into a context for daemons that simply stop. ctx carries the klog
	// logger.
	Run func(ctx context.Context, signals <-chan os.Signal) error
}

// NewCommand returns the cobra command for c: no arguments, usage not
// printed on run errors (main prints the error once), --help in sections
// wrapped to the terminal.
func NewCommand(c Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:           c.Use,
		Short:         c.Short,
		Long:          c.Long,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.Validate(); err != nil {
				return err
			}
			if err := logsapi.ValidateAndApply(c.Logging, c.Features); err != nil {
				return fmt.Errorf("logging flags: %w", err)
			}
			defer logs.FlushLogs()
			signals := make(chan os.Signal, 2)
			signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(signals)
			return c.Run(klog.NewContext(cmd.Context(), klog.Background()), signals)
		},
	}
	for _, fs := range c.Flags.FlagSets {
		cmd.Flags().AddFlagSet(fs)
	}
	cliflag.SetUsageAndHelpFunc(cmd, c.Flags, terminalWidth())
	return cmd
}

// StopOnSignal returns a context that ends with ctx or at the first
// signal, for daemons that stop (rather than drain) on SIGTERM.
func StopOnSignal(ctx context.Context, signals <-chan os.Signal) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-signals:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// AddProfiling serves Go's runtime profiles (net/http/pprof) on mux under
// /debug/pprof/, for the daemons' --profiling flags.
func AddProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// terminalWidth is the width --help wraps to: the terminal's, or no
// wrapping when the output is not a terminal.
func terminalWidth() int {
	if w, _, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
		return w
	}
	return 0
}
