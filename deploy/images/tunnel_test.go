package images_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	kclient "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"

	"github.com/moat-net/moat/internal/testenv"
	"github.com/moat-net/moat/internal/testenv/pki"
)

// testTunnelImages runs both tunnel images (scratch images: the binary and
// nothing else) and sends a request through them the way kube-apiserver
// does: the konnectivity client library on the server's Unix socket, the
// server's mTLS agent port, the agent dialing a destination on the node.
func testTunnelImages(ctx context.Context, t *testing.T, pm *podman, serverImage, agentImage string) {
	for _, image := range []string{serverImage, agentImage} {
		out, err := pm.run(ctx, "run", "--rm", "--pull=never", image, "--help")
		if err != nil || !strings.Contains(out, "--feature-gates") {
			t.Fatalf("%s --help: %v\n%s", image, err, out)
		}
	}

	dir := t.TempDir()
	pkiDir, udsDir := filepath.Join(dir, "pki"), filepath.Join(dir, "uds")
	for _, d := range []string{pkiDir, udsDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The CA, the server's certificate (for 127.0.0.1) and the agent's,
	// in PEM, as the containers read them.
	ca, err := pki.NewCA(pkiDir, "cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"server", "agent"} {
		if _, err := ca.Issue(name, "localhost", "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
	}
	caFile := "/pki/" + filepath.Base(ca.CertFile)

	// The destination on the node side: a plain HTTP server on loopback.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const greeting = "hello through the moat tunnel images"
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, greeting) })}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	prefix := fmt.Sprintf("moatimg-%d", os.Getpid())
	agentPort, serverHealth, serverAdmin := testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t)
	agentHealth, agentAdmin := testenv.FreePort(t), testenv.FreePort(t)
	server := prefix + "-proxy-server"
	pm.start(ctx, t, server,
		"--network", "host",
		"--volume", pkiDir+":/pki:ro",
		"--volume", udsDir+":/uds",
		serverImage,
		"--mode=grpc",
		"--uds-name=/uds/konnectivity-server.socket",
		"--delete-existing-uds-file",
		"--server-port=0",
		"--agent-bind-address=127.0.0.1",
		fmt.Sprintf("--agent-port=%d", agentPort),
		"--cluster-cert=/pki/server.crt",
		"--cluster-key=/pki/server.key",
		"--cluster-ca-cert="+caFile,
		"--health-bind-address=127.0.0.1",
		fmt.Sprintf("--health-port=%d", serverHealth),
		"--admin-bind-address=127.0.0.1",
		fmt.Sprintf("--admin-port=%d", serverAdmin),
	)
	waitHTTP(ctx, t, pm, server, fmt.Sprintf("http://127.0.0.1:%d/healthz", serverHealth), time.Minute)

	agent := prefix + "-proxy-agent"
	pm.start(ctx, t, agent,
		"--network", "host",
		"--volume", pkiDir+":/pki:ro",
		agentImage,
		"--proxy-server-host=127.0.0.1",
		fmt.Sprintf("--proxy-server-port=%d", agentPort),
		"--ca-cert="+caFile,
		"--agent-cert=/pki/agent.crt",
		"--agent-key=/pki/agent.key",
		"--agent-id=image-test",
		"--health-server-host=127.0.0.1",
		fmt.Sprintf("--health-server-port=%d", agentHealth),
		"--admin-bind-address=127.0.0.1",
		fmt.Sprintf("--admin-server-port=%d", agentAdmin),
	)
	// Ready: the agent holds a tunnel, the server has an agent.
	waitHTTP(ctx, t, pm, agent, fmt.Sprintf("http://127.0.0.1:%d/readyz", agentHealth), time.Minute)
	waitHTTP(ctx, t, pm, server, fmt.Sprintf("http://127.0.0.1:%d/readyz", serverHealth), time.Minute)

	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tun, err := kclient.CreateSingleUseGrpcTunnelWithContext(dialCtx, context.Background(),
		"unix://"+filepath.Join(udsDir, "konnectivity-server.socket"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("konnectivity client on the server's socket: %v", err)
	}
	client := http.Client{Transport: &http.Transport{DialContext: tun.DialContext}, Timeout: 30 * time.Second}
	resp, err := client.Get("http://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatalf("GET through the tunnel: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != greeting {
		t.Fatalf("through the tunnel got %q (%v), want %q", body, err, greeting)
	}
}
