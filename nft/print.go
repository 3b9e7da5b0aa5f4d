package nft

import (
	"fmt"
	"io"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// WriteReplace writes, in "nft -f" syntax, the transaction with which a
// Syncer replaces the whole table of node for prog: what moat-agent sends
// nft on its first sync. It is the agent's own Build and full-replace
// transaction, run without a kernel and without privileges; only the
// counters start from zero instead of carrying over what a table already
// in the kernel counted. It lists one element per command, for reading
// and diffing; the agent joins each set's run of them into one command
// (kernelNFT.Run), which nft reads as the same elements.
func WriteReplace(w io.Writer, prog *policy.Program, node string) (Result, error) {
	rs := Build(prog, node)
	tx := knftables.NewFake(knftables.InetFamily, Table).NewTransaction()
	fullTransaction(tx, rs, nil)
	res := Result{Full: true, Operations: tx.NumOperations(), Stats: rs.Stats(), Warnings: rs.warnings}
	text, err := rendered(tx)
	if err != nil {
		return res, fmt.Errorf("render table inet %s of node %s: %w", Table, node, err)
	}
	_, err = io.WriteString(w, text)
	return res, err
}
