package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/featuregate"

	"github.com/moat-net/moat/examples"
	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/internal/kubeconfig"
	"github.com/moat-net/moat/kubesource"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/policy"
	"github.com/moat-net/moat/snapshot"
)

// inputFlags are the flags of every command that reads a cluster snapshot
// (check, explain, matrix, diff, lab, nft). Commands in other files use
// them the same way:
//
//	var in inputFlags
//	in.register(cmd)            // -f, --live, --kubeconfig, --context, --feature-gates, -v, --allow-node-local
//	prog, err := in.compile(cmd) // load (say which input on stderr), report diagnostics, compile
//
// or, to work with the decoded objects, in.load(cmd) and then
// policy.Compile(&res.Cluster, in.policyOptions()).
//
// Sources: with --live, --kubeconfig or --context the snapshot is the live
// cluster (kubectl's rules: --kubeconfig, $KUBECONFIG, ~/.kube/config,
// --context, else the in-cluster service account), listed page by page and
// decoded as strictly as files; -f files are then layered on top as
// proposed changes (a policy with the same kind, namespace and name
// replaces the live one, a Namespace, Pod or Node is merged into it as
// kubectl apply would; see package snapshot). Without a live source the
// -f files are the snapshot. With neither, commands that allow it read the
// embedded quickstart example, and say so; check refuses.
type inputFlags struct {
	files          []string
	live           bool
	kubeconfig     string
	context        string
	verbose        bool
	allowNodeLocal bool
	gates          featuregate.MutableVersionedFeatureGate
	// requireInput makes running without -f and without a live source an
	// error instead of reading the embedded example.
	requireInput bool
	// pods, when set, are the only pods the command judges: the compile is
	// scoped to them (policy.Options.Pods).
	pods []string
	// node, when set, scopes the compile to one node's pods
	// (policy.Options.Node), as moat-agent compiles.
	node string
	// namespace is -n: the namespace of manifests' objects without one,
	// as kubectl apply -n (objects naming another are refused).
	// noNamespaceFlag leaves -n out (matrix, where it filters, and lab,
	// whose copies of the input are read again without it).
	namespace       string
	noNamespaceFlag bool
	// placeNS and enforceNS are what read decided for manifests: -n, or
	// with a live source the kubeconfig context's namespace (as kubectl
	// apply), else "" ("default").
	placeNS   string
	enforceNS bool
}

// register adds the input flags to cmd. (In the kubectl plugin the root
// command turns --live on unless it is given.)
func (f *inputFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.files, "filename", "f", nil, "manifest file, directory (recursive), quoted pattern ('dir/*.yaml', as kubectl -f) or - for stdin; repeatable; not a URL. With a live source, layered on top of the cluster as kubectl apply would (see moat diff --help)")
	fl.BoolVar(&f.live, "live", false, "read the live cluster (kubeconfig as kubectl finds it, or the in-cluster service account)")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file of the live cluster (implies --live)")
	fl.StringVar(&f.context, "context", "", "kubeconfig context of the live cluster (implies --live)")
	if !f.noNamespaceFlag {
		fl.StringVarP(&f.namespace, "namespace", "n", "", "namespace of -f objects without one, as kubectl apply -n (an object naming another is an error; default: with a live source the kubeconfig context's, else default)")
	}
	fl.VarPF((*verbosity)(&f.verbose), "verbose", "v", "also report skipped objects, and every warning (not only the first 20); kubectl's -v=N is taken as verbose for N > 0").NoOptDefVal = "true"
	fl.BoolVar(&f.allowNodeLocal, "allow-node-local", true, "allow traffic from a node's own addresses to its pods (kubelet probes)")
	gates, err := features.NewCLI()
	if err != nil {
		// The registry is static: this is a programming error.
		panic(err)
	}
	f.gates = gates
	gates.AddFlag(fl)
	if g := fl.Lookup("feature-gates"); g != nil {
		g.Value = gateValue{g.Value}
		g.Usage = "gates of the policy compiler, as moat-agent takes them (key=true|false,...); the CLI honours only:\n" + strings.Join(features.PolicyGates(gates), "\n")
	}
	_ = cmd.RegisterFlagCompletionFunc("context", completeContexts(f))
}

// gateValue is the --feature-gates flag, with a value that is not a
// boolean reported in words (the registry's own message ends in
// `strconv.ParseBool: parsing "maybe": invalid syntax`), and AllAlpha and
// AllBeta refused: the registry always knows them, and AllAlpha=true would
// turn IngressNetworksAndNodes on, changing verdicts, without naming it.
type gateValue struct{ pflag.Value }

func (g gateValue) Set(v string) error {
	for _, kv := range strings.Split(v, ",") {
		name, val, ok := strings.Cut(kv, "=")
		name = strings.TrimSpace(name)
		if name == "AllAlpha" || name == "AllBeta" {
			return fmt.Errorf("%s: name the gates instead (the CLI honours %s)", name, features.IngressNetworksAndNodes)
		}
		if !ok {
			continue // the registry says what is missing
		}
		if _, err := strconv.ParseBool(strings.TrimSpace(val)); err != nil {
			return fmt.Errorf("%s=%s: want true or false", name, strings.TrimSpace(val))
		}
	}
	return g.Value.Set(v)
}

// isLive reports whether the snapshot comes from a cluster.
func (f *inputFlags) isLive() bool { return f.live || f.kubeconfig != "" || f.context != "" }

// policyOptions is what the flags ask of the compiler.
func (f *inputFlags) policyOptions() policy.Options {
	return gateOptions(f.gates, policy.Options{DenyNodeLocal: !f.allowNodeLocal, Pods: f.pods, Node: f.node})
}

// gateOptions sets the compiler options that follow feature gates, so the
// CLI predicts what an agent with the same --feature-gates enforces.
func gateOptions(gates featuregate.FeatureGate, opts policy.Options) policy.Options {
	opts.IngressNetworksAndNodes = gates.Enabled(features.IngressNetworksAndNodes)
	return opts
}

// loaded is a snapshot and where it came from.
type loaded struct {
	*manifest.Result
	// Described says which input was used, for stderr.
	Described string
	// Example is the embedded example read, "" for other inputs.
	Example string
}

// load reads the snapshot the flags name and says on stderr which input
// was used. It does not judge the result: callers report diagnostics and
// refuse Dropped objects (compile does both).
func (f *inputFlags) load(cmd *cobra.Command) (*loaded, error) {
	l, err := f.read(cmd.Context(), cmd)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(cmd.ErrOrStderr(), "input:", l.Described)
	return l, nil
}

func (f *inputFlags) read(ctx context.Context, cmd *cobra.Command) (*loaded, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	var cfg *rest.Config
	nsFrom := ""
	switch {
	case f.namespace != "":
		f.placeNS, f.enforceNS, nsFrom = f.namespace, true, "-n"
	case f.isLive():
		ns, err := kubeconfig.Namespace(f.kubeconfig, f.context)
		if err != nil {
			return nil, err
		}
		f.placeNS, nsFrom = ns, "the kubeconfig context's"
	}
	if f.isLive() {
		var err error
		if cfg, err = kubeconfig.Load(f.kubeconfig, f.context, "moat"); err != nil {
			return nil, err
		}
	}
	var files *manifest.Result
	if len(f.files) > 0 {
		var err error
		files, err = f.loader(cmd, f.isLive()).Load(f.files...)
		if err != nil {
			return nil, err
		}
	}
	placed := ""
	if nsFrom != "" {
		placed = fmt.Sprintf(" (objects without a namespace in %s, %s)", f.placeNS, nsFrom)
	}
	switch {
	case f.isLive():
		snap, err := kubesource.List(ctx, cfg, kubesource.Options{})
		if err != nil {
			return nil, err
		}
		res := snap.Result
		desc := describeLive(f.context, snap)
		if files != nil {
			res = snapshot.Overlay(res, files)
			desc += "; with " + strings.Join(f.files, ", ") + " layered on top" + placed
		}
		return &loaded{Result: res, Described: desc}, nil
	case files != nil:
		return &loaded{Result: files, Described: "files " + strings.Join(f.files, ", ") + placed}, nil
	case f.requireInput:
		return nil, errors.New("no input: give manifests with -f FILE (or -f - for stdin), or read a cluster with --live, --kubeconfig or --context")
	}
	res, err := (&manifest.Loader{FS: examples.FS}).Load(examples.Quickstart)
	if err != nil {
		return nil, err
	}
	return &loaded{
		Result:    res,
		Described: fmt.Sprintf("the embedded example %q (no -f and no live cluster given)", examples.Quickstart),
		Example:   examples.Quickstart,
	}, nil
}

// loader reads manifests (-f, diff's --after) as read decided: call it
// after read. applied says the manifests stand for a kubectl apply (diff's
// --after, -f layered on a live cluster): only there does -n refuse an
// object naming another namespace, as kubectl apply -n does. -f files that
// are the snapshot itself (a dump of every namespace) only have their
// objects without a namespace placed.
func (f *inputFlags) loader(cmd *cobra.Command, applied bool) *manifest.Loader {
	return &manifest.Loader{Stdin: cmd.InOrStdin(), Namespace: f.placeNS, EnforceNamespace: f.enforceNS && applied}
}

// describeLive says which cluster was read and how much of it.
func describeLive(context string, s *kubesource.Snapshot) string {
	where := "cluster " + s.Host
	if context != "" {
		where = fmt.Sprintf("cluster %s (context %s)", s.Host, context)
	}
	var parts []string
	for _, k := range kubesource.Kinds {
		n, ok := s.Count[k.Kind]
		if !ok {
			// Its list answered 404 and discovery agrees (kubesource);
			// moat-agent waits for the kind and stays not ready meanwhile.
			parts = append(parts, k.Resource+" not served (moat-agent stays not ready without them)")
			continue
		}
		parts = append(parts, fmt.Sprintf("%d %s", n, k.Resource))
	}
	return where + ": " + strings.Join(parts, ", ")
}

// compile loads and compiles, printing diagnostics to stderr. Objects that
// could not be loaded at all make it fail: a policy left out could widen
// access. Policies that loaded but are invalid are compiled fail-closed.
func (f *inputFlags) compile(cmd *cobra.Command) (*policy.Program, error) {
	l, err := f.load(cmd)
	if err != nil {
		return nil, err
	}
	return f.compileLoaded(cmd, l.Result)
}

// maxWarnings is how many warnings a command prints before it only
// counts them.
const maxWarnings = 20

// compileLoaded compiles a loaded snapshot, reporting as compile does.
func (f *inputFlags) compileLoaded(cmd *cobra.Command, res *manifest.Result) (*policy.Program, error) {
	prog := policy.Compile(&res.Cluster, f.policyOptions())
	stderr := cmd.ErrOrStderr()
	if f.verbose {
		for _, s := range res.Skipped {
			fmt.Fprintln(stderr, "skipped:", s)
		}
	}
	// Warnings are a side channel here: a large cluster can have
	// thousands, so past maxWarnings they are counted, not printed, unless
	// -v. Errors are always printed, and only what makes the command fail
	// is an error. moat check lists everything.
	warnings := 0
	warn := func(line string) {
		if warnings++; warnings <= maxWarnings || f.verbose {
			fmt.Fprintln(stderr, line)
		}
	}
	// Policies enforced fail-closed first: without -v theirs is the only
	// notice (the validation errors behind it are verbose).
	for _, s := range prog.Status {
		if !s.Accepted {
			warn(fmt.Sprintf("warning: %s: %s", s.Policy, s.Message))
		}
	}
	// An error about an object that could not be loaded stops the
	// command (below). One about an object that was loaded (a pod address
	// that does not parse, a podIP that disagrees with podIPs, an invalid
	// policy) is judged around, the way moat-agent enforces it: the value
	// is left out or the part fails closed, and the answer stands. Here
	// that is a warning; moat check, which validates, fails on it.
	dropped := make(map[string]bool, len(res.Dropped))
	for _, r := range res.Dropped {
		dropped[r] = true
	}
	for _, d := range res.Diagnostics {
		if d.Severity == policy.SeverityError && dropped[d.Object] {
			fmt.Fprintf(stderr, "error: %s\n", d)
			continue
		}
		warn("warning: " + d.String())
	}
	for _, d := range prog.Diagnostics {
		// Invalid policies' errors are verbose: the notice above names
		// them already.
		if d.Severity == policy.SeverityWarning || f.verbose {
			warn("warning: " + d.String())
		}
	}
	if warnings > maxWarnings && !f.verbose {
		fmt.Fprintf(stderr, "... and %d more warnings: -v prints them all, as does moat check -v\n", warnings-maxWarnings)
	}
	if len(res.Dropped) > 0 {
		return nil, fmt.Errorf("%d object(s) could not be loaded (see above): refusing to judge traffic without them", len(res.Dropped))
	}
	return prog, nil
}

// completeContexts offers the contexts of the kubeconfig --live reads
// (internal/kubeconfig, the one loader).
func completeContexts(f *inputFlags) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		names, err := kubeconfig.Contexts(f.kubeconfig)
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// verbosity is -v: a boolean flag that also takes kubectl's levels
// (-v=6), an operator's habit, as verbose for any level above 0 instead
// of refusing them.
type verbosity bool

func (v *verbosity) String() string { return strconv.FormatBool(bool(*v)) }

func (v *verbosity) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		*v = verbosity(b)
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want true, false or a kubectl level (0 and up), got %q", s)
	}
	*v = n > 0
	return nil
}

func (v *verbosity) Type() string { return "bool" }

// IsBoolFlag lets -v stand alone (and --verbose=false be given).
func (v *verbosity) IsBoolFlag() bool { return true }
