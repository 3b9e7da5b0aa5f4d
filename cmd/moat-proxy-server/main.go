// Command moat-proxy-server is the control-plane side of Moat's
// konnectivity-compatible tunnel. Options are in app/options, the run loop
// in app; see docs/tunnel.md.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/moat-net/moat/cmd/moat-proxy-server/app"
)

func main() {
	cmd, err := app.NewCommand()
	if err == nil {
		err = cmd.ExecuteContext(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "moat-proxy-server:", err)
		os.Exit(1)
	}
}
