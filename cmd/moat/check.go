package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/policy"
)

func newCheckCommand() *cobra.Command {
	in := inputFlags{requireInput: true}
	cmd := &cobra.Command{
		Use:   "check (-f FILE... | --live)",
		Short: "Validate manifests or a live cluster's policies as the API server and the CRDs would, listing every violation",
		Long: `check validates NetworkPolicies (networking.k8s.io/v1, with endPort) and
ClusterNetworkPolicies (policy.networking.k8s.io/v1alpha2, experimental channel)
and prints every violation as "<Kind> <namespace/name>: <field path>: <message>"
(at most 20 findings of one object and 1,000 in all, then a count; -v prints
every one).
Unknown fields are errors. The input is required: -f files, a live cluster
(--live, --kubeconfig, --context), or both (the files layered on the cluster,
to check a change before it lands). AdminNetworkPolicy and
BaselineAdminNetworkPolicy (v1alpha1) in files are errors: Moat does not
enforce them. A live cluster is read for the five kinds Moat reads only, so
its AdminNetworkPolicies and BaselineAdminNetworkPolicies are not seen
(list them with kubectl get adminnetworkpolicies,baselineadminnetworkpolicies).
Files that hold no Kubernetes object at all are an error too, not a pass.
Exit status: 0 valid, 1 invalid or no input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := in.load(cmd)
			if err != nil {
				return err
			}
			res := l.Result
			prog := policy.Compile(&res.Cluster, in.policyOptions())
			out := cmd.OutOrStdout()
			errs, shown, hidden := 0, 0, 0
			perObject := map[string]int{}
			for _, list := range [][]policy.Diagnostic{res.Diagnostics, prog.Diagnostics} {
				for _, d := range list {
					isErr := d.Severity == policy.SeverityError || notEnforcedKind(d)
					if isErr {
						errs++
					}
					// Findings are bounded unless -v: a file of a few
					// kilobytes could otherwise print megabytes.
					if perObject[d.Object]++; !in.verbose && (perObject[d.Object] > maxFindingsPerObject || shown == maxFindings) {
						hidden++
						continue
					}
					shown++
					if isErr {
						fmt.Fprintln(out, d)
					} else {
						fmt.Fprintln(cmd.ErrOrStderr(), "warning:", d)
					}
				}
			}
			if hidden > 0 {
				fmt.Fprintf(out, "... and %d more findings (shown: at most %d per object, %d in all; -v lists every one)\n", hidden, maxFindingsPerObject, maxFindings)
			}
			if in.verbose {
				for _, s := range res.Skipped {
					fmt.Fprintln(cmd.ErrOrStderr(), "skipped:", s)
				}
			}
			if errs > 0 {
				return fmt.Errorf("%d error(s)", errs)
			}
			fmt.Fprintf(out, "ok: %d NetworkPolicies, %d ClusterNetworkPolicies valid\n", len(res.Cluster.NetworkPolicies), len(res.Cluster.ClusterNetworkPolicies))
			return nil
		},
	}
	in.register(cmd)
	return cmd
}

// check prints at most maxFindingsPerObject findings of one object and
// maxFindings in all unless -v, then counts the rest: enough to fix a
// file and go on, without output that grows many times faster than the
// input.
const (
	maxFindingsPerObject = 20
	maxFindings          = 1000
)

// notEnforcedKind: a policy of a kind Moat reads no rule of (decoding
// warns of it). check counts it as an error, since a pipeline gated on
// check would otherwise pass policies that nothing enforces.
func notEnforcedKind(d policy.Diagnostic) bool {
	return strings.HasPrefix(d.Object, "AdminNetworkPolicy ") || strings.HasPrefix(d.Object, "BaselineAdminNetworkPolicy ")
}
