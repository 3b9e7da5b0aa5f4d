package nft

import (
	"errors"
	"io"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/moat-net/moat/policy"
)

// WriteReplace writes, in "nft -f" syntax, the transaction with which a
// Syncer replaces the whole table of node for prog: what moat-agent sends
// nft on its first sync. It is the agent's own Build and full-replace
// transaction, run without a kernel and without privileges; only the
// counters start from zero instead of carrying over what a table already
// in the kernel counted.
func WriteReplace(w io.Writer, prog *policy.Program, node string) (Result, error) {
	rs := Build(prog, node)
	tx := knftables.NewFake(knftables.InetFamily, Table).NewTransaction()
	fullTransaction(tx, rs, nil)
	res := Result{Full: true, Operations: tx.NumOperations(), Stats: rs.Stats(), Warnings: rs.warnings}
	text := tx.String()
	// knftables reports an object it refused as a trailing comment.
	if i := strings.LastIndex(text, "# ERROR: "); i >= 0 {
		return res, errors.New("render table inet " + Table + " of node " + node + ": " + strings.TrimSpace(text[i+len("# ERROR: "):]))
	}
	_, err := io.WriteString(w, text)
	return res, err
}
