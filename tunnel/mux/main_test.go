package mux

import (
	"testing"

	"go.uber.org/goleak"
)

// Every session and connection goroutine must be gone when tests end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
