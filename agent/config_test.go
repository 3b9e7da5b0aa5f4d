package agent

import (
	"strings"
	"testing"
	"time"
)

// Config's completion fills the election's timing from the exported
// defaults (which moat-agent's flags also use), checks it only when the
// agent campaigns (moat-agent --leader-elect=false accepts any
// --leader-elect-* durations), and rejects an order client-go's
// leaderelection cannot run.
func TestCompleteLeaderElectionTiming(t *testing.T) {
	c := Config{NodeName: "n1", LeaderElection: LeaderElection{Enabled: true}}
	if err := c.complete(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if le := c.LeaderElection; le.LeaseDuration != DefaultLeaseDuration || le.RenewDeadline != DefaultRenewDeadline || le.RetryPeriod != DefaultRetryPeriod {
		t.Errorf("defaults: %+v", le)
	}
	if err := c.LeaderElection.CheckTiming(); err != nil {
		t.Errorf("the default timing fails its own check: %v", err)
	}
	bad := LeaderElection{LeaseDuration: time.Minute, RenewDeadline: 10 * time.Second, RetryPeriod: time.Hour}
	c = Config{NodeName: "n1", LeaderElection: bad}
	if err := c.complete(); err != nil {
		t.Errorf("election off, retry period above renew deadline: %v", err)
	}
	bad.Enabled = true
	c = Config{NodeName: "n1", LeaderElection: bad}
	if err := c.complete(); err == nil || !strings.Contains(err.Error(), "retry period 1h0m0s, renew deadline 10s, lease duration 1m0s: want 0 < retry period < renew deadline") {
		t.Errorf("election on, retry period above renew deadline: %v", err)
	}
	for _, le := range []LeaderElection{
		{LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second},
		{LeaseDuration: 10 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: time.Second},
	} {
		if le.CheckTiming() == nil {
			t.Errorf("CheckTiming(%+v) = nil", le)
		}
	}
}
