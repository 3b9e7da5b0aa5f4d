// Package examples holds runnable scenarios, one folder each: manifests, a
// README, the arguments of its matrix (matrix.args) and the expected matrix
// (matrix.golden). The folders are embedded so `moat` has a default input.
package examples

import "embed"

// FS holds every example folder.
//
//go:embed */*.yaml */README.md */matrix.args
var FS embed.FS

// Quickstart is the folder `moat` reads when no -f is given.
const Quickstart = "quickstart"
