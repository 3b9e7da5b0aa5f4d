package main

import (
	"bufio"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-net/moat/nft"
	"github.com/moat-net/moat/policy"
)

func newNftCommand() *cobra.Command {
	// The output is meant for "nft -f" as root: never the embedded
	// example's ruleset by accident.
	in := inputFlags{requireInput: true}
	var node string
	cmd := &cobra.Command{
		Use:   "nft --node NAME (-f FILE... | --live)",
		Short: "Print the nftables ruleset moat-agent would program on a node",
		Long: `nft prints table inet moat as moat-agent programs it on the node NAME, in
"nft -f" syntax, without root and without touching the host's nftables: the
agent's own code (the same compiler options and feature gates, the same
ruleset builder and transaction) renders the transaction the agent runs on
its first sync, in a stable order for reading and diffing.

Like the agent's, the transaction deletes any table inet moat and creates
it anew, so "nft -f" of the output replaces the table in one step.
Counts of chains, rules, sets and elements and any warnings go to stderr.`,
		Example: `  moat nft --node node-1 -f manifests/ > node-1.nft
  moat nft --node node-1 -f manifests/ | nft -c -f -    # as root: does nft accept it?`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return errors.New("--node is required: the node whose ruleset to print")
			}
			// Compile for the node alone, as the agent does.
			in.node = node
			l, err := in.load(cmd)
			if err != nil {
				return err
			}
			if err := knownNode(&l.Cluster, node); err != nil {
				return err
			}
			prog, err := in.compileLoaded(cmd, l.Result)
			if err != nil {
				return err
			}
			return printNodeRuleset(cmd, prog, node)
		},
	}
	in.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "the node (Node name, or the spec.nodeName of its pods) whose ruleset to print")
	return cmd
}

// printNodeRuleset prints the agent's first-sync transaction for node.
func printNodeRuleset(cmd *cobra.Command, prog *policy.Program, node string) error {
	out := bufio.NewWriterSize(cmd.OutOrStdout(), 1<<16)
	fmt.Fprintf(out, "# table inet %s as moat-agent programs it on node %s (its first sync: the whole table replaced)\n", nft.Table, node)
	res, err := nft.WriteReplace(out, prog, node)
	if err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	for _, w := range res.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	st := res.Stats
	fmt.Fprintf(stderr, "node %s: %d chains, %d rules, %d sets, %d set and map elements, %d nft operations\n", node, st.Chains, st.Rules, st.Sets, st.Elements, res.Operations)
	return nil
}

// knownNode refuses a node the snapshot does not mention: a misspelt name
// would print an empty ruleset.
func knownNode(c *policy.Cluster, node string) error {
	names := map[string]bool{}
	for _, n := range c.Nodes {
		names[n.Name] = true
	}
	for i := range c.Pods {
		if n := c.Pods[i].NodeName; n != "" {
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
