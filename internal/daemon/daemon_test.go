package daemon

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	cliflag "k8s.io/component-base/cli/flag"
)

// testOptions are a daemon's options with one flag of its own.
type testOptions struct {
	Common
	name     string
	validate error
}

func (o *testOptions) Flags() cliflag.NamedFlagSets {
	var fss cliflag.NamedFlagSets
	fss.FlagSet("daemon").StringVar(&o.name, "name", "", "a name")
	o.AddLoggingFlags(&fss)
	return fss
}

func (o *testOptions) Validate() error {
	if err := o.ValidateLogging(); err != nil {
		return err
	}
	return o.validate
}

func newTestOptions(t *testing.T, validate error) *testOptions {
	t.Helper()
	c, err := NewCommon()
	if err != nil {
		t.Fatal(err)
	}
	return &testOptions{Common: c, validate: validate}
}

// TestNewCommand runs Run in one case only: component-base applies logging
// once per process.
func TestNewCommand(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		validate error
		wantErr  string
		wantRun  bool
	}{
		{name: "runs with its flags", args: []string{"--name=x", "-v=2"}, wantRun: true},
		{name: "validation stops it before Run", args: []string{"--name=x"}, validate: errors.New("--name: bad"), wantErr: "--name: bad"},
		{name: "no arguments", args: []string{"extra"}, wantErr: "unknown command"},
		{name: "bad logging format", args: []string{"--logging-format=xml"}, wantErr: "Unsupported log format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			o := newTestOptions(t, tc.validate)
			cmd := NewCommand("d", "a daemon", "", o, func(ctx context.Context, signals <-chan os.Signal) error {
				ran = true
				// SIGTERM to this process must reach Run (and not kill
				// the test): StopOnSignal ends the context.
				ctx, stop := StopOnSignal(ctx, signals)
				defer stop()
				if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(30 * time.Second):
					return errors.New("SIGTERM did not end the context")
				}
			})
			cmd.SetArgs(tc.args)
			cmd.SetOut(new(bytes.Buffer))
			cmd.SetErr(new(bytes.Buffer))
			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if ran != tc.wantRun {
				t.Fatalf("Run called %v, want %v", ran, tc.wantRun)
			}
			if tc.wantRun && o.name != "x" {
				t.Fatalf("--name bound to %q", o.name)
			}
		})
	}
}

func TestHelpShowsSections(t *testing.T) {
	cmd := NewCommand("d", "a daemon", "", newTestOptions(t, nil), func(context.Context, <-chan os.Signal) error { return nil })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Daemon flags:", "Logging flags:", "--name", "--logging-format"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
}
