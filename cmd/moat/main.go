// Command moat reads Kubernetes NetworkPolicies and ClusterNetworkPolicies
// from manifests or a live cluster and answers questions about them:
// check validates, explain judges one flow, matrix prints who can reach
// whom, diff lists the flows a change would turn, lab enforces with real
// nftables in network namespaces, nft prints the ruleset the agent would
// program on a node. Installed (or linked) as kubectl-moat it
// is also the kubectl plugin `kubectl moat`, reading the current context's
// cluster by default.
//
// This package keeps flags and output; loading, judging and rendering live
// in the packages it calls (manifest, kubesource, snapshot, policy, matrix,
// whatif, lab).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// exitError carries an exit status other than 1 through cobra; every
// other error exits 1.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func (e *exitError) Unwrap() error { return e.err }

// pluginName is the executable name kubectl (and krew) look for;
// completeName the one kubectl runs to complete the plugin's arguments.
const (
	pluginName   = "kubectl-moat"
	completeName = "kubectl_complete-moat"
)

// invocation reads how the binary was called: as moat, as the kubectl
// plugin, or as the plugin's completion helper (which completes args).
func invocation(argv0 string, args []string) (plugin bool, _ []string) {
	switch strings.TrimSuffix(filepath.Base(argv0), ".exe") {
	case pluginName:
		return true, args
	case completeName:
		return true, append([]string{cobra.ShellCompRequestCmd}, args...)
	}
	return false, args
}

func main() {
	plugin, args := invocation(os.Args[0], os.Args[1:])
	root := newRootCommand(plugin)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		name := "moat"
		if plugin {
			name = pluginName
		}
		os.Exit(report(os.Stderr, name, err))
	}
}

// report prints err and returns the exit status it stands for.
func report(w io.Writer, name string, err error) int {
	code := 1
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if err.Error() != "" {
		fmt.Fprintf(w, "%s: %v\n", name, err)
	}
	return code
}

// newRootCommand builds the command tree. As the kubectl plugin it is
// named "kubectl moat" and reads the live cluster unless told otherwise.
func newRootCommand(plugin bool) *cobra.Command {
	root := &cobra.Command{
		Use:           "moat",
		Short:         "Validate, explain and enforce Kubernetes network policy",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if plugin {
		// kubectl's plugin convention: usage lines say "kubectl moat".
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl moat"}
		root.Short += " (kubectl plugin: reads the current context's cluster unless --live=false)"
		root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
			if fl := cmd.Flags().Lookup("live"); fl != nil && !fl.Changed {
				// lab up and apply keep a copy of their input, which
				// works for files only: given -f, that is their input.
				if cmd.Annotations[filesOnly] != "" && cmd.Flags().Changed("filename") {
					return nil
				}
				return fl.Value.Set("true")
			}
			return nil
		}
	}
	root.AddCommand(newCheckCommand(), newExplainCommand(), newMatrixCommand(), newDiffCommand(), newLabCommand(), newNftCommand(), newVersionCommand())
	return root
}
