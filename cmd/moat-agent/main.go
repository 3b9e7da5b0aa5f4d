// Command moat-agent runs on every node (a DaemonSet): it watches the API
// server and keeps the node's nftables table "inet moat" in step with the
// cluster's NetworkPolicies and ClusterNetworkPolicies. Options are in
// app/options, the run loop in app; see docs/agent.md.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/moat-net/moat/cmd/moat-agent/app"
)

func main() {
	cmd, err := app.NewCommand()
	if err == nil {
		err = cmd.ExecuteContext(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "moat-agent:", err)
		os.Exit(1)
	}
}
