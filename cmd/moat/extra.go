package main

import "github.com/spf13/cobra"

// extraCommands lists commands that live in their own files (lab).
func extraCommands() []*cobra.Command {
	return nil
}
