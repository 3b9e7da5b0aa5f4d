package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// DefaultRecheckInterval is Config.RecheckInterval's default: a revoked
// token, a Node whose addresses changed or a deleted Node ends its agent's
// tunnel within five minutes, at one TokenReview (and, where the agent's
// claims need it, one Node read) per agent and interval.
const DefaultRecheckInterval = 5 * time.Minute

// Unavailable is implemented by errors of an Authenticator or a NodeLookup
// that got no answer (the API server is down or slow), as against a token
// that was refused or a Node that does not exist. A re-check that fails so
// keeps the tunnel until the next re-check: an API server outage must not
// close every agent's tunnel, while a refusal ends it at once.
type Unavailable interface{ Unavailable() bool }

func unavailable(err error) bool {
	var u Unavailable
	return errors.As(err, &u) && u.Unavailable()
}

// errCertificateExpired ends a tunnel whose client certificate's validity
// has ended: a new handshake with it would be refused, so the tunnel it
// opened must not outlive it.
var errCertificateExpired = errors.New("its client certificate has expired")

// certExpiry is when the verified chain of the agent's client certificate
// stops being valid (the earliest NotAfter in it), zero without one.
func certExpiry(ctx context.Context) time.Time {
	return chainExpiry(verifiedChain(ctx))
}

func chainExpiry(chain []*x509.Certificate) time.Time {
	var t time.Time
	for _, c := range chain {
		if t.IsZero() || c.NotAfter.Before(t) {
			t = c.NotAfter
		}
	}
	return t
}

// watchIdentity ends an agent's tunnel (cancel, with the reason) once what
// admitted it no longer holds: at its certificate's expiry, and when a
// re-check every RecheckInterval (a fresh TokenReview of the token it
// connected with, its claims checked again against its credentials and
// its Node's current addresses) refuses it. Checked only at connect, a
// revoked token, a Node address that moved to another node or an expired
// certificate kept its tunnel and its claims, and with them a share of
// other nodes' connections, for as long as the stream lived. A re-check
// that gets no answer (Unavailable) keeps the tunnel until the next one.
func (s *Server) watchIdentity(ctx context.Context, cancel context.CancelCauseFunc, agentID string, expiry time.Time, recheck func(context.Context) error) {
	var expired <-chan time.Time
	if !expiry.IsZero() {
		t := time.NewTimer(time.Until(expiry))
		defer t.Stop()
		expired = t.C
	}
	var tick <-chan time.Time
	var timer *time.Timer
	next := func() time.Duration {
		// ±10% so that agents that connected together (a server
		// restart) are not all reviewed in the same second.
		d := s.cfg.RecheckInterval
		return d - d/10 + rand.N(d/5+1)
	}
	if recheck != nil && s.cfg.RecheckInterval > 0 {
		timer = time.NewTimer(next())
		defer timer.Stop()
		tick = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-expired:
			s.closed.WithLabelValues("certificate_expired").Inc()
			s.log.Info("Closing agent tunnel: its client certificate has expired", "agentID", agentID, "notAfter", expiry)
			cancel(errCertificateExpired)
			return
		case <-tick:
			err := recheck(ctx)
			switch {
			case err == nil:
			case ctx.Err() != nil:
				return
			case unavailable(err):
				s.log.Info("Agent re-check got no answer: keeping its tunnel until the next one", "agentID", agentID, "err", err)
			default:
				s.closed.WithLabelValues("recheck_refused").Inc()
				s.log.Info("Closing agent tunnel: its credentials no longer admit it", "agentID", agentID, "err", err)
				cancel(fmt.Errorf("re-check: %w", err))
				return
			}
			timer.Reset(next())
		}
	}
}
