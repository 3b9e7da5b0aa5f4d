//go:build !moatbench

package app

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/moat-net/moat/agent"
)

// checkedResyncOnUser1 does nothing outside -tags moatbench builds (see
// benchhook.go).
func checkedResyncOnUser1(context.Context, *agent.Agent, klog.Logger) {}
