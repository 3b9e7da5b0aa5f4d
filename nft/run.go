package nft

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"sigs.k8s.io/knftables"
)

// maxJoined bounds the elements joined into one command: nft's error for
// a failing command quotes the whole line, and a few hundred elements
// already take nearly all of the gain.
const maxJoined = 256

// Run runs tx through nft with each run of element commands on one set
// joined into one command (joinElements). knftables (v0.0.22) renders
// one command per element, and a full replace at 30,000 pods is ~63,000
// of them: nft takes about twice as long for those as for the same
// elements in one command per set, and the agent's first sync and every
// resync wait for it. The text is knftables' own rendering; only line
// boundaries change, so what the kernel ends up holding is the same.
// Nor does it keep the text between runs, as knftables' Run does with its
// largest transaction's for as long as the Interface lives (megabytes
// after a full replace).
func (k kernelNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	return k.run(ctx, tx)
}

// Check is Run with nft's --check: nothing is committed.
func (k kernelNFT) Check(ctx context.Context, tx *knftables.Transaction) error {
	return k.run(ctx, tx, "--check")
}

func (k kernelNFT) run(ctx context.Context, tx *knftables.Transaction, flags ...string) error {
	text, err := rendered(tx)
	if err != nil {
		return err
	}
	var script bytes.Buffer
	// Joined, the elements of a full replace take about half the text.
	script.Grow(len(text) / 2)
	joinElements(&script, text)
	cmd := exec.CommandContext(ctx, k.path, append(flags, "-f", "-")...)
	cmd.Stdin = &script
	if _, err := cmd.Output(); err != nil {
		return nftError(err)
	}
	return nil
}

// rendered is tx in "nft -f" syntax. An object knftables refuses stops
// the transaction: knftables renders what came before it and then the
// error as a comment ("# ERROR: ..."), and its own Run sends nothing.
// Sending the part before it would leave out the rest of the table.
func rendered(tx *knftables.Transaction) (string, error) {
	text := tx.String()
	if i := strings.LastIndex(text, "# ERROR: "); i == 0 || i > 0 && text[i-1] == '\n' {
		return "", errors.New(strings.TrimSpace(text[i+len("# ERROR: "):]))
	}
	return text, nil
}

// maxErrText bounds the nft output an error carries: nft quotes the
// failing command, which may be a long line of joined elements.
const maxErrText = 4096

// nftError gives nft's own message (stderr) when it ran and failed.
func nftError(err error) error {
	var ee *exec.ExitError
	if !errors.As(err, &ee) || len(ee.Stderr) == 0 {
		return fmt.Errorf("nft: %w", err)
	}
	msg := strings.TrimSpace(string(ee.Stderr))
	if len(msg) > maxErrText {
		msg = msg[:maxErrText] + " [...]"
	}
	return fmt.Errorf("nft: %s: %w", msg, err)
}

// joinElements writes the nft script src to dst with each run of
// consecutive element commands that differ only in their element,
//
//	add element inet moat s { 10.0.0.1 }
//	add element inet moat s { 10.0.0.2 }
//
// written as one command of up to maxJoined elements,
//
//	add element inet moat s { 10.0.0.1, 10.0.0.2 }
//
// which nft reads as the same two additions. Commands whose element
// carries a quoted string (a comment) are copied as they are.
func joinElements(dst *bytes.Buffer, src string) {
	var open string // the command prefix of the run being written
	n := 0
	for len(src) > 0 {
		line, rest, _ := strings.Cut(src, "\n")
		src = rest
		prefix, elem, ok := elementCommand(line)
		if ok && open == prefix && n < maxJoined {
			dst.WriteString(", ")
			dst.WriteString(elem)
			n++
			continue
		}
		if open != "" {
			dst.WriteString(" }\n")
			open, n = "", 0
		}
		if ok {
			dst.WriteString(prefix)
			dst.WriteString(" { ")
			dst.WriteString(elem)
			open, n = prefix, 1
			continue
		}
		dst.WriteString(line)
		dst.WriteByte('\n')
	}
	if open != "" {
		dst.WriteString(" }\n")
	}
}

// elementCommand splits "add element inet moat s { e }" (or "delete
// element") into its prefix and element e, when e can be listed with
// others.
func elementCommand(line string) (prefix, elem string, ok bool) {
	if !strings.HasPrefix(line, "add element ") && !strings.HasPrefix(line, "delete element ") {
		return "", "", false
	}
	prefix, body, found := strings.Cut(line, " { ")
	if !found || !strings.HasSuffix(body, " }") {
		return "", "", false
	}
	elem = body[:len(body)-2]
	if elem == "" || strings.ContainsAny(elem, "\"{},") {
		return "", "", false
	}
	return prefix, elem, true
}
