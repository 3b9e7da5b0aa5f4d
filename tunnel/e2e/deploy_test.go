package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	cliflag "k8s.io/component-base/cli/flag"
	"sigs.k8s.io/yaml"

	agentoptions "github.com/moat-net/moat/cmd/moat-proxy-agent/app/options"
	serveroptions "github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
)

// flagSet gathers a binary's named flag sets into one, as its command does.
func flagSet(name string, fss cliflag.NamedFlagSets) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	for _, f := range fss.FlagSets {
		fs.AddFlagSet(f)
	}
	return fs
}

// TestDeployManifests decodes the static pods strictly and runs their
// command lines through the binaries' own flag parsing and validation.
func TestDeployManifests(t *testing.T) {
	type opts interface {
		Flags() cliflag.NamedFlagSets
		Validate() error
	}
	for file, mk := range map[string]func() (opts, error){
		"../../deploy/tunnel/moat-proxy-server.yaml": func() (opts, error) { return serveroptions.New() },
		"../../deploy/tunnel/moat-proxy-agent.yaml":  func() (opts, error) { return agentoptions.New() },
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict(b, &pod); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		o, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		fs := flagSet(file, o.Flags())
		if err := fs.Parse(pod.Spec.Containers[0].Command[1:]); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	unit, err := os.ReadFile("../../deploy/tunnel/moat-proxy-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, f := range strings.Fields(strings.ReplaceAll(string(unit[strings.Index(string(unit), "ExecStart="):]), "\\\n", " ")) {
		if strings.HasPrefix(f, "--") {
			args = append(args, f)
		}
		if f == "KillSignal=SIGTERM" {
			break
		}
	}
	o, _ := agentoptions.New()
	fs := flagSet("unit", o.Flags())
	if err := fs.Parse(args); err != nil {
		t.Fatalf("systemd unit: %v", err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("systemd unit: %v", err)
	}
}
