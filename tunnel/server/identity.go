package server

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/moat-net/moat/tunnel/proto"
)

// IdentityBinding says whether an agent's self-declared agentID and
// agentIdentifiers must agree with what authenticated it. Upstream trusts
// both, so any holder of an agent credential shared by every node can claim
// another node's identifiers and receive kube-apiserver's connections meant
// for it; a credential that names its node closes that gap.
type IdentityBinding string

// Identity bindings (--agent-identity-binding).
const (
	// BindAuto binds agents whose credential names a node and leaves the
	// others (a certificate shared by every node, a token bound to no
	// node) as upstream: the default.
	BindAuto IdentityBinding = "auto"
	// BindRequired also refuses agents whose credential names no node.
	BindRequired IdentityBinding = "required"
	// BindOff trusts every agent's claims, as upstream does.
	BindOff IdentityBinding = "off"
)

// ParseIdentityBinding parses --agent-identity-binding.
func ParseIdentityBinding(s string) (IdentityBinding, error) {
	switch b := IdentityBinding(s); b {
	case BindAuto, BindRequired, BindOff:
		return b, nil
	}
	return "", fmt.Errorf("--agent-identity-binding %q: want auto, required or off", s)
}

// credential is what an agent's credentials say about which node it is.
type credential struct {
	// node is the node named, "" when none is.
	node string
	// what says where node came from, for logs and errors.
	what string
	// hosts and addrs are the names and addresses the credential vouches
	// for besides node: a node certificate's DNS and IP SANs.
	hosts []string
	addrs []netip.Addr
}

// certCredential reads the verified client certificate of the agent's TLS
// connection, if any; an unverified one (no --cluster-ca-cert) names nothing.
func certCredential(ctx context.Context) credential {
	chain := verifiedChain(ctx)
	if len(chain) == 0 {
		return credential{}
	}
	return nodeCert(chain[0])
}

// verifiedChain is the first verified chain of the agent's TLS client
// certificate, leaf first; nil without one (no --cluster-ca-cert, or no
// TLS).
func verifiedChain(ctx context.Context) []*x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0]
}

// nodeCert is the node a client certificate names (subject CN
// system:node:<name>) with its SANs; any other certificate names none.
func nodeCert(c *x509.Certificate) credential {
	node, hosts, addrs := proto.NodeCert(c)
	if node == "" {
		return credential{}
	}
	return credential{node: node, hosts: hosts, addrs: addrs, what: "client certificate (CN " + c.Subject.CommonName + ")"}
}

// NodeLookup reads what a Node object says about its node: the IP
// addresses (InternalIP, ExternalIP) and DNS names (Hostname, InternalDNS,
// ExternalDNS) of its status.addresses. A token names its node but not the
// node's addresses; this is where a token-bound agent's ipv4=, ipv6= and
// host= claims are checked, against the addresses kube-apiserver itself
// dials the node's kubelet at.
type NodeLookup interface {
	NodeAddresses(ctx context.Context, node string) (addrs []netip.Addr, hosts []string, err error)
}

// lookupError is a failed NodeLookup: the agent's claims could not be
// checked (not that they were wrong), so it is refused as Unavailable and
// retries.
type lookupError struct{ err error }

func (e lookupError) Error() string { return e.err.Error() }
func (e lookupError) Unwrap() error { return e.err }

// bindIdentity checks an agent's claims against its credentials: where one
// names a node, the agentID must be that node's name, and every identifier
// the destHost strategy routes by must be one the credentials vouch for:
// host= the node's name or a DNS SAN of its certificate, ipv4=/ipv6= an IP
// SAN; with a token bound to the node (and Config.Nodes set) also a
// DNS name or IP address of the Node's status.addresses; cidr= (a claim on
// many nodes' addresses) never. default-route=true is allowed: it competes
// for the defaultRoute strategy, which picks among every such agent, not
// for any one node's traffic.
//
// It returns the node the agent is bound to, "" if none.
func (s *Server) bindIdentity(ctx context.Context, cert, token credential, agentID string, ids proto.Identifiers) (string, error) {
	if s.cfg.IdentityBinding == BindOff {
		return "", nil
	}
	if cert.node != "" && token.node != "" && cert.node != token.node {
		return "", fmt.Errorf("its %s names node %q but its %s names node %q", cert.what, cert.node, token.what, token.node)
	}
	cr := cert
	if cr.node == "" {
		cr = token
	}
	if cr.node == "" {
		if s.cfg.IdentityBinding == BindRequired {
			return "", fmt.Errorf("its credentials name no node (a client certificate with CN %s<node> or a token bound to a pod or Node is needed with --agent-identity-binding=required)", proto.NodeCertPrefix)
		}
		return "", nil
	}
	const hint = "; or start the server with --agent-identity-binding=off to trust agents' own claims, as upstream does"
	if agentID != cr.node {
		return "", fmt.Errorf("its %s names node %q: run the agent with --agent-id=%s%s", cr.what, cr.node, cr.node, hint)
	}
	if len(ids.CIDRs) > 0 {
		return "", fmt.Errorf("identifier cidr=%s claims many nodes' addresses, which a node's credential cannot vouch for%s", ids.CIDRs[0], hint)
	}
	hostOK := func(h string) bool { return h == strings.ToLower(cr.node) || slices.Contains(cr.hosts, h) }
	addrOK := func(a netip.Addr) bool { return slices.Contains(cr.addrs, a) }
	// What vouches for the claims, for the errors: the certificate where
	// it names the node, the Node object where a token is bound to it.
	var vouchers []string
	if cert.node != "" {
		vouchers = append(vouchers, "its certificate")
	}
	if token.node != "" && s.cfg.Nodes != nil &&
		(slices.ContainsFunc(ids.Hosts, func(h string) bool { return !hostOK(h) }) ||
			slices.ContainsFunc(ids.Addrs, func(a netip.Addr) bool { return !addrOK(a) })) {
		// Looked up only for a claim the certificate does not cover, so
		// agents claiming nothing but their name cost no request.
		addrs, hosts, err := s.cfg.Nodes.NodeAddresses(ctx, token.node)
		if err != nil {
			return "", lookupError{fmt.Errorf("its %s names node %q, whose addresses vouch for its identifiers, but they could not be read: %w", token.what, token.node, err)}
		}
		cr.addrs = append(slices.Clip(cr.addrs), addrs...)
		cr.hosts = append(slices.Clip(cr.hosts), hosts...)
		vouchers = append(vouchers, fmt.Sprintf("Node %q's status.addresses", token.node))
	}
	if len(vouchers) == 0 {
		vouchers = append(vouchers, "its credentials (a token bound to a node vouches only for the node's name when the server does not read Node objects)")
	}
	by := strings.Join(vouchers, " or ")
	for _, h := range ids.Hosts {
		if !hostOK(h) {
			return "", fmt.Errorf("identifier host=%s is neither its node's name %q nor a DNS name of %s%s", h, cr.node, by, hint)
		}
	}
	for _, a := range ids.Addrs {
		if !addrOK(a) {
			return "", fmt.Errorf("identifier %s is not an IP address of %s (they vouch for %v)%s", a, by, cr.addrs, hint)
		}
	}
	return cr.node, nil
}
