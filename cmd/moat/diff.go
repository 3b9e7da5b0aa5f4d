package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/flowdiff"
	"github.com/moat-net/moat/manifest"
	"github.com/moat-net/moat/matrix"
	"github.com/moat-net/moat/policy"
	"github.com/moat-net/moat/snapshot"
)

// exitChanged is the status of a diff in which some flow changes verdict
// or a pod is added or removed, as kubectl diff exits 1 on differences
// (moat's 1 is an error).
const exitChanged = 3

func newDiffCommand() *cobra.Command {
	var (
		in            = inputFlags{requireInput: true}
		after, delete []string
		prune         bool
		ports, peers  []string
		output        string
	)
	cmd := &cobra.Command{
		Use:   "diff (-f CURRENT... | --live) [-n NAMESPACE] (--after PROPOSED... | --delete KIND/[NAMESPACE/]NAME...) [--prune] [--port N/PROTO]... [--peer IP]... [-o table|json|html]",
		Short: "List every flow whose verdict a proposed change turns, with both explanations (exit 3 if any)",
		Long: `diff compares the current state (-f files, or a live cluster with -f layered
on top) with the proposed state: the current state with the --after files
layered on top as kubectl apply would (a policy with the same kind,
namespace and name replaces the current one whole; a Namespace, Pod or Node
is merged into the current one: its labels set, the others kept, the
current status - pod IPs, node addresses - kept unless the manifest has
one; new objects are added; see "moat diff --after" in the README), without
the objects named by --delete (KIND/NAMESPACE/NAME or KIND/NAME; kubectl's
short names work; a Namespace takes its Pods and NetworkPolicies with it, a
Node its Pods, as in Kubernetes), and, with --prune, without every NetworkPolicy and ClusterNetworkPolicy the
--after files do not define (compare two complete policy sets, such as two
revisions of a GitOps repository).

Objects of --after without a namespace go where kubectl apply would put
them: in -n's namespace, else with --live in the kubeconfig context's,
else in default (with a warning); with -n, an --after object naming
another namespace is an error, as with kubectl apply -n, whatever its
kind (a ConfigMap too; not a built-in cluster-scoped kind).

It lists every flow whose verdict changes, from every endpoint to every
endpoint. The endpoints are the pods both states have (by namespace/name),
the --peer addresses, every node address, and implied peers: one address
for each class of addresses no pod or node has that the rules of either
state can tell apart (inside an ipBlock or networks CIDR and outside its
excepts, inside each except, outside all of them; per family), named by
the class ("198.51.100.0/24", "10.0.0.0/8 except 10.1.0.0/16",
"0.0.0.0/0"). Without --port, each pair is judged on one port per class of
the (protocol, port) space that the rules judging it (the source's egress
and the destination's ingress, in either state) can tell apart: ports in
the same rules' port lists are one class ("8000-9000", "TCP 80, 443"), and
everything no rule names by port - the other ports, the other protocols,
ICMP and protocols without ports - is one more, "the rest". Declared
container ports are informational in Kubernetes (an undeclared port is
reachable): they only choose which port of a class is shown, as in
"1/TCP (any port or protocol but TCP 443)" or "8000/TCP (any of
8000-9000)". Every address, protocol and port is thus judged by the probe
of its class, so no change can hide between probes. With
--port, only those ports are judged, towards every endpoint.

Each line gives the verdicts before and after and the explanation of each
direction that changed. Only the flows a change can affect are judged, so
a small change in a large cluster is quick.

Pods only one state has (with an address: --delete ns/X removes X's pods,
an --after Pod with a status adds one) are listed as added or removed,
not compared flow by flow: their flows appear or disappear whole.

Exit status: 0 when no verdict changes and no pod is added or removed, 3
when a verdict changes or a pod is added or removed (every flow to and
from it appears or disappears), 1 on error - to gate CI and GitOps
pipelines as kubectl diff does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mopts, err := matrix.ParseOptions(ports, peers)
			if err != nil {
				return err
			}
			switch output {
			case "table", "", "json", "html":
			default:
				return fmt.Errorf("-o: must be table, json or html, got %q", output)
			}
			if len(after) == 0 && len(delete) == 0 {
				return fmt.Errorf("nothing proposed: give --after FILE... (layered on the current state) or --delete KIND/NAMESPACE/NAME")
			}
			if prune && len(after) == 0 {
				return fmt.Errorf("--prune needs --after: the complete set of proposed policies")
			}
			if slices.Contains(after, "-") && slices.Contains(in.files, "-") {
				return fmt.Errorf("-f - and --after - cannot both read stdin")
			}
			var refs []snapshot.Ref
			for _, d := range delete {
				r, err := snapshot.ParseRef(d)
				if err != nil {
					return fmt.Errorf("--delete %w", err)
				}
				refs = append(refs, r)
			}
			cur, err := in.load(cmd)
			if err != nil {
				return err
			}
			next, desc, err := proposed(in.loader(cmd, true), cur.Result, after, refs, prune)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.ErrOrStderr(), "proposed: the input", desc)
			if len(cur.Dropped) > 0 {
				return fmt.Errorf("%d object(s) of the current state could not be loaded: refusing to judge traffic without them", len(cur.Dropped))
			}
			before := policy.Compile(&cur.Cluster, in.policyOptions())
			afterProg, err := in.compileLoaded(cmd, next)
			if err != nil {
				return err
			}
			res := flowdiff.Compute(before, afterProg, flowdiff.Options{Ports: mopts.Ports, Peers: mopts.Peers})
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				err = flowdiff.WriteJSON(out, res)
			case "html":
				err = flowdiff.WriteHTML(out, res)
			default:
				err = flowdiff.WriteTable(out, res)
			}
			if err != nil {
				return err
			}
			if res.Changed() {
				return &exitError{exitChanged, errors.New(changeSummary(res))}
			}
			return nil
		},
	}
	in.register(cmd)
	cmd.Flags().StringArrayVar(&after, "after", nil, "proposed manifests (file, directory or -), layered on the current state; repeatable")
	cmd.Flags().StringArrayVar(&delete, "delete", nil, "an object the change deletes, KIND/NAMESPACE/NAME or KIND/NAME; repeatable")
	cmd.Flags().BoolVar(&prune, "prune", false, "delete the current NetworkPolicies and ClusterNetworkPolicies that --after does not define")
	cmd.Flags().StringArrayVar(&ports, "port", nil, "judge only this port towards every destination, N or N/PROTO (repeatable; default: one port per class of ports the rules tell apart)")
	cmd.Flags().StringArrayVar(&peers, "peer", nil, "extra endpoint outside the pod network, an IP address (repeatable)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table, json or html")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "html"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// proposed builds the proposed state from the current one and says how.
func proposed(loader *manifest.Loader, cur *manifest.Result, after []string, refs []snapshot.Ref, prune bool) (*manifest.Result, string, error) {
	next := cur
	var says []string
	if len(after) > 0 {
		files, err := loader.Load(after...)
		if err != nil {
			return nil, "", fmt.Errorf("--after: %w", err)
		}
		next = snapshot.Overlay(cur, files)
		says = append(says, "with "+strings.Join(after, ", ")+" layered on top")
		if prune {
			pruned := snapshot.PrunePolicies(cur, files)
			refs = append(refs, pruned...)
			says = append(says, fmt.Sprintf("%d policies pruned", len(pruned)))
		}
	}
	if len(refs) > 0 {
		var err error
		withContents := snapshot.Cascade(next, refs)
		if next, err = snapshot.Delete(next, refs); err != nil {
			return nil, "", err
		}
		var names []string
		for _, r := range refs {
			names = append(names, r.String())
		}
		say := "deleting " + strings.Join(names, ", ")
		if extra := withContents[len(refs):]; len(extra) > 0 {
			pods := 0
			for _, r := range extra {
				if r.Kind == "Pod" {
					pods++
				}
			}
			say += fmt.Sprintf(" (and, as Kubernetes deletes them with it, the %d Pod(s) and %d NetworkPolicy(ies) in it)", pods, len(extra)-pods)
		}
		says = append(says, say)
	}
	return next, strings.Join(says, "; "), nil
}

// changeSummary is the error line of a diff that changes traffic: the
// changed flows, then the pods added and removed that made it a change.
func changeSummary(res *flowdiff.Result) string {
	parts := []string{fmt.Sprintf("%d flow(s) change verdict", res.ChangedFlows())}
	if n := len(res.AddedPods); n > 0 {
		parts = append(parts, fmt.Sprintf("%d pod(s) added", n))
	}
	if n := len(res.RemovedPods); n > 0 {
		parts = append(parts, fmt.Sprintf("%d pod(s) removed", n))
	}
	return strings.Join(parts, ", ")
}
