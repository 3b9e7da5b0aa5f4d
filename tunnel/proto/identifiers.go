package proto

import (
	"crypto/x509"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// NodeCertPrefix starts the subject common name of an agent certificate
// that names its node, as the kubelet's client certificates do
// (system:node:<name>, the convention Kubernetes' Node authorizer reads). A
// server binding agent identities holds such an agent to that name.
const NodeCertPrefix = "system:node:"

// Identifiers are what an agent announces in agentIdentifiers.
type Identifiers struct {
	Hosts        []string
	Addrs        []netip.Addr
	CIDRs        []netip.Prefix
	DefaultRoute bool
}

// ParseIdentifiers decodes "ipv4=..&ipv6=..&host=..&cidr=..&default-route=true".
func ParseIdentifiers(s string) (Identifiers, error) {
	var id Identifiers
	q, err := url.ParseQuery(s)
	if err != nil {
		return id, fmt.Errorf("%q: %w", s, err)
	}
	for k, vs := range q {
		for _, v := range vs {
			switch k {
			case "host":
				id.Hosts = append(id.Hosts, strings.ToLower(v))
			case "ipv4", "ipv6":
				a, err := netip.ParseAddr(v)
				if err != nil {
					return id, fmt.Errorf("%s=%q: %w", k, v, err)
				}
				id.Addrs = append(id.Addrs, a.Unmap())
			case "cidr":
				p, err := netip.ParsePrefix(v)
				if err != nil {
					return id, fmt.Errorf("cidr=%q: %w", v, err)
				}
				id.CIDRs = append(id.CIDRs, p.Masked())
			case "default-route":
				id.DefaultRoute = v == "true"
			default:
				return id, fmt.Errorf("unknown identifier type %q", k)
			}
		}
	}
	return id, nil
}

// MatchesHost reports whether host (an IP or a name) is one of the agent's
// identifiers; the destHost strategy routes by it.
func (id Identifiers) MatchesHost(host string) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		a = a.Unmap()
		for _, x := range id.Addrs {
			if x == a {
				return true
			}
		}
		for _, p := range id.CIDRs {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, h := range id.Hosts {
		if h == host {
			return true
		}
	}
	return false
}

// NodeCert is what a node's client certificate says: the node its
// subject CN names (NodeCertPrefix + node; "" for any other certificate)
// and its SANs as agents claim them and servers check them, DNS names in
// lower case without a trailing dot, IP addresses unmapped. The agent
// (what it announces) and the server (what it lets it claim) read a
// certificate only through it, so they cannot disagree.
func NodeCert(c *x509.Certificate) (node string, hosts []string, addrs []netip.Addr) {
	node, ok := strings.CutPrefix(c.Subject.CommonName, NodeCertPrefix)
	if !ok || node == "" {
		return "", nil, nil
	}
	for _, h := range c.DNSNames {
		hosts = append(hosts, strings.ToLower(strings.TrimSuffix(h, ".")))
	}
	for _, ip := range c.IPAddresses {
		if a, ok := netip.AddrFromSlice(ip); ok {
			addrs = append(addrs, a.Unmap())
		}
	}
	return node, hosts, addrs
}
