// Package logging builds the binaries' structured logger (log/slog) from
// --v and --log-format.
package logging

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/pflag"
)

// Options are the logging flags.
type Options struct {
	V      int
	Format string
}

// AddFlags registers --v and --log-format.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IntVarP(&o.V, "v", "v", 0, "log verbosity: 0 info, 4 and above debug")
	fs.StringVar(&o.Format, "log-format", "text", "log format: text or json")
}

// New returns the logger, or an error naming the bad flag.
func (o *Options) New(w io.Writer) (*slog.Logger, error) {
	lvl := slog.LevelInfo
	if o.V >= 4 {
		lvl = slog.LevelDebug
	}
	h := &slog.HandlerOptions{Level: lvl}
	switch o.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, h)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, h)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", o.Format)
	}
}
