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
	p, ok := peer.FromContext(ctx)
	if !ok {
		return credential{}
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return credential{}
	}
	return nodeCert(info.State.VerifiedChains[0][0])
}

// nodeCert is the node a client certificate names (subject CN
// system:node:<name>) with its SANs; any other certificate names none.
func nodeCert(c *x509.Certificate) credential {
	node, ok := strings.CutPrefix(c.Subject.CommonName, proto.NodeCertPrefix)
	if !ok || node == "" {
		return credential{}
	}
	cr := credential{node: node, what: "client certificate (CN " + c.Subject.CommonName + ")"}
	for _, h := range c.DNSNames {
		cr.hosts = append(cr.hosts, strings.ToLower(strings.TrimSuffix(h, ".")))
	}
	for _, ip := range c.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			cr.addrs = append(cr.addrs, a.Unmap())
		}
	}
	return cr
}

// bindIdentity checks an agent's claims against its credentials: where one
// names a node, the agentID must be that node's name, and every identifier
// the destHost strategy routes by must be one the credential vouches for:
// host= the node's name or a DNS SAN of its certificate, ipv4=/ipv6= an IP
// SAN; cidr= (a claim on many nodes' addresses) never. default-route=true
// is allowed: it competes for the defaultRoute strategy, which picks among
// every such agent, not for any one node's traffic.
//
// It returns the node the agent is bound to, "" if none.
func (s *Server) bindIdentity(cert, token credential, agentID string, ids proto.Identifiers) (string, error) {
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
	for _, h := range ids.Hosts {
		if h != strings.ToLower(cr.node) && !slices.Contains(cr.hosts, h) {
			return "", fmt.Errorf("identifier host=%s is neither its node's name %q nor a DNS name of its certificate%s", h, cr.node, hint)
		}
	}
	for _, a := range ids.Addrs {
		if !slices.Contains(cr.addrs, a) {
			return "", fmt.Errorf("identifier %s is not an IP address of its certificate (its %s vouches for %v)%s", a, cr.what, cr.addrs, hint)
		}
	}
	if len(ids.CIDRs) > 0 {
		return "", fmt.Errorf("identifier cidr=%s claims many nodes' addresses, which a node's credential cannot vouch for%s", ids.CIDRs[0], hint)
	}
	return cr.node, nil
}
