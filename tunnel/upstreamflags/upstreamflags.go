// Package upstreamflags lets moat-proxy-server and moat-proxy-agent start
// from upstream konnectivity manifests: it registers, on a daemon's flag
// set, upstream flags that have no meaning for Moat, so that they parse
// (with a warning) instead of failing startup. Each daemon's options list
// its own; klog's legacy flags, which both upstream binaries accept, are
// here. docs/tunnel.md lists every accepted, mapped and ignored flag.
package upstreamflags

import (
	"time"

	"github.com/spf13/pflag"
)

// Kind is how an ignored flag's value parses: as upstream's does, so that
// a malformed value is still refused.
type Kind int

// Kinds of ignored flags.
const (
	String Kind = iota
	Bool
	Duration
	Int
	Float
	Strings
)

// Ignored is an upstream flag Moat accepts and ignores. Why says what Moat
// does instead; it is shown in --help and in the warning printed when the
// flag is set.
type Ignored struct {
	Name string
	Kind Kind
	Why  string
}

// Ignore describes an ignored flag.
func Ignore(name string, kind Kind, why string) Ignored {
	return Ignored{Name: name, Kind: kind, Why: why}
}

// Klog are klog's own flags, which upstream's binaries register with
// dashes (--logtostderr, --log-file, ...). Moat logs through component-base
// to stderr (-v, --vmodule, --logging-format).
func Klog() []Ignored {
	return []Ignored{
		Ignore("logtostderr", Bool, "Moat logs to stderr; see -v, --vmodule and --logging-format"),
		Ignore("alsologtostderr", Bool, "Moat logs to stderr"),
		Ignore("log-dir", String, "Moat logs to stderr only"),
		Ignore("log-file", String, "Moat logs to stderr only"),
		Ignore("log-file-max-size", Int, "Moat logs to stderr only"),
		Ignore("stderrthreshold", String, "Moat logs every severity to stderr"),
		Ignore("one-output", Bool, "Moat logs to stderr only"),
		Ignore("skip-headers", Bool, "the log format is --logging-format's"),
		Ignore("skip-log-headers", Bool, "the log format is --logging-format's"),
		Ignore("add-dir-header", Bool, "the log format is --logging-format's"),
		Ignore("log-backtrace-at", String, "not supported"),
	}
}

// AddIgnored registers flags on fs, each deprecated with its reason: pflag
// prints "Flag --NAME has been deprecated, ignored: WHY" when one is set.
func AddIgnored(fs *pflag.FlagSet, flags []Ignored) {
	for _, f := range flags {
		switch f.Kind {
		case Bool:
			fs.Bool(f.Name, false, "")
		case Duration:
			fs.Duration(f.Name, 0, "")
		case Int:
			fs.Int(f.Name, 0, "")
		case Float:
			fs.Float64(f.Name, 0, "")
		case Strings:
			fs.StringSlice(f.Name, nil, "")
		default:
			fs.String(f.Name, "", "")
		}
		_ = fs.MarkDeprecated(f.Name, "ignored: "+f.Why)
		Unhide(fs, f.Name)
	}
}

// Unhide keeps a deprecated flag in --help (pflag hides deprecated flags),
// where its deprecation message tells operators what Moat does instead.
func Unhide(fs *pflag.FlagSet, name string) { fs.Lookup(name).Hidden = false }

// PositiveDuration is a flag value that sets *D only from a positive
// duration, for an upstream flag mapped onto a Moat bound: upstream's 0
// ("no bound") leaves Moat's bound as it is.
type PositiveDuration struct{ D *time.Duration }

func (p PositiveDuration) String() string {
	if p.D == nil {
		return "0s"
	}
	return p.D.String()
}

// Set parses s as a duration.
func (p PositiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d > 0 {
		*p.D = d
	}
	return nil
}

// Type is pflag's name for the value's kind.
func (PositiveDuration) Type() string { return "duration" }
