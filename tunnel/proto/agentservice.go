package proto

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/proto/client"
)

// AgentServiceName is the package-less full name upstream's agent.proto
// declares; stock agents call ConnectMethod on it.
const AgentServiceName = "AgentService"

// ConnectMethod is the full method path agents dial.
const ConnectMethod = "/AgentService/Connect"

// AgentServiceServer is implemented by the proxy server to accept agent
// tunnels. It mirrors upstream's generated interface.
type AgentServiceServer interface {
	Connect(AgentService_ConnectServer) error
}

// AgentService_ConnectServer is the server side of one agent tunnel.
type AgentService_ConnectServer interface { //nolint:revive // mirrors upstream naming
	Send(*client.Packet) error
	Recv() (*client.Packet, error)
	grpc.ServerStream
}

type connectServer struct{ grpc.ServerStream }

func (s *connectServer) Send(p *client.Packet) error { return s.ServerStream.SendMsg(p) }

func (s *connectServer) Recv() (*client.Packet, error) {
	p := new(client.Packet)
	if err := s.ServerStream.RecvMsg(p); err != nil {
		return nil, err
	}
	return p, nil
}

func connectHandler(srv any, stream grpc.ServerStream) error {
	return srv.(AgentServiceServer).Connect(&connectServer{stream})
}

// AgentServiceDesc is a hand-written service descriptor equivalent to the one
// protoc would generate for upstream's agent.proto. It registers no protobuf
// file descriptor, so it cannot collide with the client module's registrations.
var AgentServiceDesc = grpc.ServiceDesc{
	ServiceName: AgentServiceName,
	HandlerType: (*AgentServiceServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Connect",
		Handler:       connectHandler,
		ServerStreams: true,
		ClientStreams: true,
	}},
	Metadata: "agent.proto",
}

// RegisterAgentServiceServer registers srv on s under /AgentService/Connect.
func RegisterAgentServiceServer(s grpc.ServiceRegistrar, srv AgentServiceServer) {
	s.RegisterService(&AgentServiceDesc, srv)
}

// AgentService_ConnectClient is the agent side of one tunnel.
type AgentService_ConnectClient interface { //nolint:revive // mirrors upstream naming
	Send(*client.Packet) error
	Recv() (*client.Packet, error)
	grpc.ClientStream
}

type connectClient struct{ grpc.ClientStream }

func (c *connectClient) Send(p *client.Packet) error { return c.ClientStream.SendMsg(p) }

func (c *connectClient) Recv() (*client.Packet, error) {
	p := new(client.Packet)
	if err := c.ClientStream.RecvMsg(p); err != nil {
		return nil, err
	}
	return p, nil
}

// Connect opens the agent's bidirectional stream on cc.
func Connect(ctx context.Context, cc grpc.ClientConnInterface, opts ...grpc.CallOption) (AgentService_ConnectClient, error) {
	st, err := cc.NewStream(ctx, &AgentServiceDesc.Streams[0], ConnectMethod, opts...)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", ConnectMethod, err)
	}
	return &connectClient{st}, nil
}
