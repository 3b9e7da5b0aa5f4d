package main

import (
	"encoding/json"
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion is what `moat version` reports, from the build information
// the Go toolchain embeds (module version for `go install ...@version`,
// VCS revision and time for builds in a clone).
type buildVersion struct {
	Module    string `json:"module"`
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"goVersion"`
}

func readVersion() (buildVersion, error) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildVersion{}, fmt.Errorf("no build information in this binary")
	}
	v := buildVersion{Module: bi.Main.Path, Version: bi.Main.Version, GoVersion: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v, nil
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o text|json]",
		Short: "Print the module version and the source revision this binary was built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v, err := readVersion()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			case "text", "":
				fmt.Fprintf(out, "%s %s", v.Module, v.Version)
				if v.Revision != "" {
					fmt.Fprintf(out, " (revision %s", v.Revision)
					if v.Time != "" {
						fmt.Fprintf(out, ", %s", v.Time)
					}
					if v.Modified {
						fmt.Fprint(out, ", modified")
					}
					fmt.Fprint(out, ")")
				}
				fmt.Fprintf(out, " %s\n", v.GoVersion)
				return nil
			}
			return fmt.Errorf("-o: must be text or json, got %q", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
