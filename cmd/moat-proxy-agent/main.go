// Command moat-proxy-agent is the node side of Moat's konnectivity-compatible
// tunnel. Options are in app/options, the run loop in app; see
// docs/tunnel.md.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/moat-net/moat/cmd/moat-proxy-agent/app"
)

func main() {
	cmd, err := app.NewCommand()
	if err == nil {
		err = cmd.ExecuteContext(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "moat-proxy-agent:", err)
		os.Exit(1)
	}
}
