package main

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

func newNftCommand() *cobra.Command {
	var in inputFlags
	var node string
	cmd := &cobra.Command{
		Use:   "nft --node NAME [-f FILE...]",
		Short: "Print the nftables ruleset moat-agent would program on a node",
		Long: `nft prints table inet moat as moat-agent programs it on the node NAME, in
"nft -f" syntax, without root and without touching the host's nftables: the
agent's own code (the same compiler options and feature gates, the same
nft.Syncer) writes its first, full-replace transaction into an in-memory
table, which is then printed in a stable order for reading and diffing.

The output starts by deleting any table inet moat, as the agent's full
replace does, so "nft -f" of it replaces the table in one transaction.
Counts of chains, rules, sets and elements and any warnings go to stderr.`,
		Example: `  moat nft --node node-1 -f manifests/ > node-1.nft
  moat nft --node node-1 -f manifests/ | nft -c -f -    # as root: does nft accept it?`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return errors.New("--node is required: the node whose ruleset to print")
			}
			prog, err := in.compile(cmd)
			if err != nil {
				return err
			}
			if err := knownNode(prog, node); err != nil {
				return err
			}
			return printNodeRuleset(cmd, prog, node)
		},
	}
	in.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "the node (Node name, or the spec.nodeName of its pods) whose ruleset to print")
	return cmd
}

// printNodeRuleset runs the agent's Syncer against an in-memory table and
// prints what it programmed.
func printNodeRuleset(cmd *cobra.Command, prog *policy.Program, node string) error {
	table := knftables.NewFake(knftables.InetFamily, nft.Table)
	res, err := nft.New(table, nft.Options{Node: node}).Sync(cmd.Context(), prog)
	if err != nil {
		return fmt.Errorf("build the ruleset of node %s: %w", node, err)
	}
	stderr := cmd.ErrOrStderr()
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	st := res.Stats
	fmt.Fprintf(stderr, "node %s: %d chains, %d rules, %d sets, %d set and map elements\n", node, st.Chains, st.Rules, st.Sets, st.Elements)
	return writeTable(cmd.OutOrStdout(), node, table.Dump())
}

// writeTable writes the dump after a header and the agent's replace
// preamble (add, so that the delete is legal on a host without the table).
func writeTable(w io.Writer, node, dump string) error {
	_, err := fmt.Fprintf(w, "# table inet %[1]s as moat-agent programs it on node %[2]s\nadd table inet %[1]s\ndelete table inet %[1]s\n%[3]s", nft.Table, node, dump)
	return err
}

// knownNode refuses a node the snapshot does not mention: a misspelt name
// would print an empty ruleset.
func knownNode(prog *policy.Program, node string) error {
	names := map[string]bool{}
	for _, n := range prog.Nodes {
		names[n.Name] = true
	}
	for i := range prog.Pods {
		if n := prog.Pods[i].NodeName; n != "" {
			names[n] = true
		}
	}
	if names[node] {
		return nil
	}
	known := make([]string, 0, len(names))
	for n := range names {
		known = append(known, n)
	}
	sort.Strings(known)
	if len(known) > 10 {
		known = append(known[:10], "...")
	}
	if len(known) == 0 {
		return fmt.Errorf("node %q: the input has no Node objects and no scheduled pods", node)
	}
	return fmt.Errorf("node %q: no Node object and no pod scheduled on it (known: %s)", node, strings.Join(known, ", "))
}
