package e2e

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/moat-net/moat/tunnel/proto"
)

// TestReusableTunnel drives the client library's newer reusable tunnel (one
// gRPC connection, one Proxy stream per dial) through Moat.
func TestReusableTunnel(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{})
	startAgent(t, p, ps.agentAddr, nil)
	eventually(t, "agent tunnel", ps.srv.Ready)
	hs := httpBackend(t)
	tun, err := kclient.CreateGRPCTunnel(context.Background(), ps.frontAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, p))))
	if err != nil {
		t.Fatal(err)
	}
	defer tun.Close()
	for _, path := range []string{"/a", "/b", "/c"} {
		got := httpGetVia(t, func(ctx context.Context, addr string) (net.Conn, error) { return tun.DialContext(ctx, "tcp", addr) }, hs.URL+path)
		if got != "hello "+path {
			t.Fatalf("got %q", got)
		}
	}
}

// TestAgentMetadata: agentID must be present exactly once and
// agentIdentifiers must parse; otherwise the tunnel is refused with
// InvalidArgument naming the problem.
func TestAgentMetadata(t *testing.T) {
	p := newPKI(t)
	ps := startServer(t, p, serverOpts{})
	cc, err := grpc.NewClient(ps.agentAddr, grpc.WithTransportCredentials(agentCreds(t, p, p.agent)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	for name, md := range map[string]metadata.MD{
		"no agentID":         metadata.Pairs(),
		"two agentIDs":       metadata.Pairs("agentID", "a", "agentID", "b"),
		"empty agentID":      metadata.Pairs("agentID", ""),
		"bad identifiers":    metadata.Pairs("agentID", "a", "agentIdentifiers", "ipv4=not-an-ip"),
		"unknown identifier": metadata.Pairs("agentID", "a", "agentIdentifiers", "colour=red"),
	} {
		ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), md))
		st, err := proto.Connect(ctx, cc)
		if err == nil {
			_, err = st.Recv()
		}
		cancel()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: want InvalidArgument, got %v", name, err)
		}
	}
	if n := ps.srv.Backends(); n != 0 {
		t.Fatalf("%d agents registered", n)
	}
}
