package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/component-base/featuregate"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
)

// inputFlags are the flags every command that reads manifests shares.
type inputFlags struct {
	files          []string
	verbose        bool
	allowNodeLocal bool
	// gates are the agent's feature gates with the agent's defaults, so
	// that the CLI predicts what an agent with the same --feature-gates
	// enforces.
	gates featuregate.MutableVersionedFeatureGate
}

func (f *inputFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVarP(&f.files, "filename", "f", nil, "manifest file, directory (recursive) or - for stdin; repeatable (default: the embedded quickstart example)")
	cmd.Flags().BoolVarP(&f.verbose, "verbose", "v", false, "also report skipped objects")
	cmd.Flags().BoolVar(&f.allowNodeLocal, "allow-node-local", true, "allow traffic from a node's own addresses to its pods (kubelet probes)")
	gates, err := features.New()
	if err != nil {
		panic(err) // the registry is static: a failure is a programming error
	}
	f.gates = gates
	gates.AddFlag(cmd.Flags())
}

// options are the compiler options the flags ask for.
func (f *inputFlags) options() policy.Options {
	return policy.Options{
		DenyNodeLocal:           !f.allowNodeLocal,
		IngressNetworksAndNodes: f.gates.Enabled(features.IngressNetworksAndNodes),
	}
}

// load reads the input; with no -f it reads the embedded quickstart.
func (f *inputFlags) load(stdin io.Reader) (*manifest.Result, error) {
	if len(f.files) == 0 {
		l := manifest.Loader{FS: examples.FS}
		return l.Load(examples.Quickstart)
	}
	l := manifest.Loader{Stdin: stdin}
	return l.Load(f.files...)
}

// compile loads and compiles, printing diagnostics to stderr. Objects that
// could not be loaded at all make it fail: a policy left out could widen
// access. Policies that loaded but are invalid are compiled fail-closed.
func (f *inputFlags) compile(cmd *cobra.Command) (*policy.Program, error) {
	res, err := f.load(cmd.InOrStdin())
	if err != nil {
		return nil, &exitError{1, err}
	}
	prog := policy.Compile(&res.Cluster, f.options())
	stderr := cmd.ErrOrStderr()
	if f.verbose {
		for _, s := range res.Skipped {
			fmt.Fprintln(stderr, "skipped:", s)
		}
	}
	for _, d := range res.Diagnostics {
		fmt.Fprintf(stderr, "%s: %s\n", d.Severity, d)
	}
	for _, d := range prog.Diagnostics {
		if d.Severity == policy.SeverityWarning || f.verbose {
			fmt.Fprintf(stderr, "%s: %s\n", d.Severity, d)
		}
	}
	for _, s := range prog.Status {
		if !s.Accepted {
			fmt.Fprintf(stderr, "warning: %s: %s\n", s.Policy, s.Message)
		}
	}
	if len(res.Dropped) > 0 {
		return nil, &exitError{1, fmt.Errorf("%d object(s) could not be loaded (see above): refusing to judge traffic without them", len(res.Dropped))}
	}
	return prog, nil
}
