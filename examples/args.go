package examples

import (
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"

	"github.com/moat-net/moat/features"
	"github.com/moat-net/moat/matrix"
)

// Args are an example's matrix.args: the `moat matrix` flags (--port,
// --peer, --feature-gates) that reproduce its matrix.golden. This is the
// one parser of that file; the golden test, the lab's example test and
// moat's default input all read it here.
type Args struct {
	// Matrix holds --port and --peer.
	Matrix matrix.Options
	// FeatureGates is the --feature-gates value, empty for the defaults.
	FeatureGates string
}

// ParseArgs reads the flags of a matrix.args file (whitespace-separated,
// `--flag value` or `--flag=value`).
func ParseArgs(text string) (Args, error) {
	flags := pflag.NewFlagSet("matrix.args", pflag.ContinueOnError)
	flags.SetOutput(io.Discard)
	var ports, peers []string
	var gates string
	flags.StringArrayVar(&ports, "port", nil, "")
	flags.StringArrayVar(&peers, "peer", nil, "")
	flags.StringVar(&gates, "feature-gates", "", "")
	if err := flags.Parse(strings.Fields(text)); err != nil {
		return Args{}, err
	}
	if flags.NArg() > 0 {
		return Args{}, fmt.Errorf("unexpected argument %q", flags.Arg(0))
	}
	opts, err := matrix.ParseOptions(ports, peers)
	if err != nil {
		return Args{}, err
	}
	a := Args{Matrix: opts, FeatureGates: gates}
	if _, err := a.Gates(); err != nil {
		return Args{}, err
	}
	return a, nil
}

// ReadArgs reads and parses the matrix.args of the example folder name.
func ReadArgs(name string) (Args, error) {
	file := path.Join(name, "matrix.args")
	raw, err := fs.ReadFile(FS, file)
	if err != nil {
		return Args{}, err
	}
	a, err := ParseArgs(string(raw))
	if err != nil {
		return Args{}, fmt.Errorf("%s: %w", file, err)
	}
	return a, nil
}

// Gates returns the moat CLI's feature gates (features.NewCLI) set as the
// --feature-gates value asks.
func (a Args) Gates() (featuregate.FeatureGate, error) {
	fg, err := features.NewCLI()
	if err != nil {
		return nil, err
	}
	if a.FeatureGates != "" {
		if err := fg.Set(a.FeatureGates); err != nil {
			return nil, fmt.Errorf("--feature-gates: %w", err)
		}
	}
	return fg, nil
}
