// Command moat reads Kubernetes NetworkPolicies and ClusterNetworkPolicies
// from manifests and answers questions about them without a cluster:
// check validates, explain judges one flow, matrix prints who can reach
// whom, lab enforces with real nftables in network namespaces.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// exitError carries an exit status through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func main() {
	root := newRootCommand()
	if err := root.Execute(); err != nil {
		code := 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
		if err.Error() != "" {
			fmt.Fprintln(os.Stderr, "moat:", err)
		}
		os.Exit(code)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "moat",
		Short:         "Validate, explain and enforce Kubernetes network policy",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newCheckCommand(), newExplainCommand(), newMatrixCommand(), newLabCommand())
	return root
}
