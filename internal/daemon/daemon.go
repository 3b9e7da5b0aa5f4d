// Package daemon is the one way Moat's three daemons (moat-agent,
// moat-proxy-server, moat-proxy-agent) become commands: flags in named
// sections for --help, Validate before anything starts, component-base
// logging applied from the same flags (-v, --logging-format=json), logs
// flushed on exit, the Go memory limit set from the container's
// (memlimit.go), and SIGTERM/SIGINT delivered to the run loop; their
// options embed Common (feature gate and logging configuration). Each
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
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/moat-net/moat/features"
)

// Common are the options every daemon has: its feature gate (the
// features registry, whose logging gates klog reads) and its logging
// configuration. A daemon's Options embed it.
type Common struct {
	Features featuregate.MutableVersionedFeatureGate
	Logging  *logsapi.LoggingConfiguration
	// GCPercent is the daemon's garbage-collection target when GOGC is
	// not set (0: Go's default, 100); see applyGCPercent.
	GCPercent int
}

// NewCommon returns the common options at their defaults.
func NewCommon() (Common, error) {
	fg, err := features.New()
	if err != nil {
		return Common{}, err
	}
	return Common{Features: fg, Logging: logsapi.NewLoggingConfiguration()}, nil
}

// AddLoggingFlags adds the "logging" section (-v, --logging-format, ...).
func (c *Common) AddLoggingFlags(fss *cliflag.NamedFlagSets) {
	logsapi.AddFlags(c.Logging, fss.FlagSet("logging"))
}

// ValidateLogging checks the logging flags, for a daemon's Validate.
func (c *Common) ValidateLogging() error {
	if fe := logsapi.Validate(c.Logging, c.Features, nil); len(fe) > 0 {
		return fmt.Errorf("logging flags: %w", fe.ToAggregate())
	}
	return nil
}

func (c *Common) common() *Common { return c }

// Options are a daemon's options (cmd/<bin>/app/options): its flags in
// sections for --help, the checks that need no cluster, and Common.
type Options interface {
	Flags() cliflag.NamedFlagSets
	Validate() error
	common() *Common
}

// NewCommand returns the cobra command of a daemon: no arguments, usage
// not printed on run errors (main prints the error once), --help in
// sections wrapped to the terminal. When it runs it validates o, applies
// the logging flags, sets the daemon's garbage-collection target
// (Common.GCPercent) unless GOGC is set and the Go memory limit from the
// cgroup's unless GOMEMLIMIT is set, and calls run until it returns. run's signals
// receives SIGTERM and SIGINT (room for two, so a daemon that drains on
// the first can exit at once on the second); StopOnSignal turns it into
// a context for daemons that simply stop. run's ctx carries the klog
// logger.
func NewCommand(use, short, long string, o Options, run func(ctx context.Context, signals <-chan os.Signal) error) *cobra.Command {
	fss := o.Flags()
	cmd := &cobra.Command{
		Use:           use,
		Short:         short,
		Long:          long,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			c := o.common()
			if err := logsapi.ValidateAndApply(c.Logging, c.Features); err != nil {
				return fmt.Errorf("logging flags: %w", err)
			}
			defer logs.FlushLogs()
			if p := applyGCPercent(c.GCPercent); p > 0 {
				klog.Background().V(2).Info("Go garbage-collection target set", "percent", p)
			}
			if soft, err := applyMemoryLimit(cgroupRoot, procCgroup); err != nil {
				klog.Background().Error(err, "Go memory limit not set from the cgroup's")
			} else if soft > 0 {
				klog.Background().Info("Go memory limit set from the cgroup's", "bytes", soft, "share", memoryLimitShare)
			}
			signals := make(chan os.Signal, 2)
			signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(signals)
			return run(klog.NewContext(cmd.Context(), klog.Background()), signals)
		},
	}
	for _, fs := range fss.FlagSets {
		cmd.Flags().AddFlagSet(fs)
	}
	cliflag.SetUsageAndHelpFunc(cmd, fss, terminalWidth())
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
