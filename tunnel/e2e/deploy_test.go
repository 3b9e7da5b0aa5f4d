package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	cliflag "k8s.io/component-base/cli/flag"
	"sigs.k8s.io/yaml"

	agentoptions "github.com/moat-net/moat/cmd/moat-proxy-agent/app/options"
	serveroptions "github.com/moat-net/moat/cmd/moat-proxy-server/app/options"
	"github.com/moat-net/moat/internal/testenv"
	testpki "github.com/moat-net/moat/internal/testenv/pki"
	"github.com/moat-net/moat/tunnel/agent"
	"github.com/moat-net/moat/tunnel/proto"
	"github.com/moat-net/moat/tunnel/server"
)

// flagSet gathers a binary's named flag sets into one, as its command does.
func flagSet(name string, fss cliflag.NamedFlagSets) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	for _, f := range fss.FlagSets {
		fs.AddFlagSet(f)
	}
	return fs
}

// TestDeployManifests decodes the static pods and the DaemonSet strictly
// and runs their command lines through the binaries' own flag parsing and
// validation.
func TestDeployManifests(t *testing.T) {
	type opts interface {
		Flags() cliflag.NamedFlagSets
		Validate() error
	}
	for file, mk := range map[string]func() (opts, error){
		"../../deploy/tunnel/moat-proxy-server.yaml": func() (opts, error) { return serveroptions.New() },
		"../../deploy/tunnel/moat-proxy-agent.yaml":  func() (opts, error) { return agentoptions.New() },
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var pod corev1.Pod
		if err := yaml.UnmarshalStrict(b, &pod); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		o, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		fs := flagSet(file, o.Flags())
		if err := fs.Parse(pod.Spec.Containers[0].Command[1:]); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if err := o.Validate(); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	// The DaemonSet's agent, its downward-API variables filled in as the
	// kubelet does.
	b, err := os.ReadFile("../../deploy/tunnel/moat-proxy-agent-daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(string(b), "\n---\n")
	var ds appsv1.DaemonSet
	if len(docs) != 2 {
		t.Fatalf("moat-proxy-agent-daemonset.yaml: %d documents, want its ServiceAccount and DaemonSet", len(docs))
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &ds); err != nil {
		t.Fatalf("moat-proxy-agent-daemonset.yaml: %v", err)
	}
	vars := strings.NewReplacer("$(NODE_NAME)", "node-a", "$(HOST_IP)", "192.0.2.10")
	var dsArgs []string
	for _, a := range ds.Spec.Template.Spec.Containers[0].Command[1:] {
		dsArgs = append(dsArgs, vars.Replace(a))
	}
	ao, _ := agentoptions.New()
	if err := flagSet("daemonset", ao.Flags()).Parse(dsArgs); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	if err := ao.Validate(); err != nil {
		t.Fatalf("DaemonSet: %v", err)
	}
	unit, err := os.ReadFile("../../deploy/tunnel/moat-proxy-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, f := range strings.Fields(strings.ReplaceAll(string(unit[strings.Index(string(unit), "ExecStart="):]), "\\\n", " ")) {
		if strings.HasPrefix(f, "--") {
			args = append(args, f)
		}
		if f == "KillSignal=SIGTERM" {
			break
		}
	}
	o, _ := agentoptions.New()
	fs := flagSet("unit", o.Flags())
	if err := fs.Parse(args); err != nil {
		t.Fatalf("systemd unit: %v", err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("systemd unit: %v", err)
	}
}

// manifestArgs parses a static pod's command line into a binary's options.
func manifestArgs(t *testing.T, file string, o interface{ Flags() cliflag.NamedFlagSets }) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict(b, &pod); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if err := flagSet(file, o.Flags()).Parse(pod.Spec.Containers[0].Command[1:]); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// TestPerNodeCertificates is the shipped install path's identity: the
// agent CA issues each node its own certificate with
// deploy/tunnel/issue-agent-cert.sh (run here with openssl, as an
// operator runs it), the agent of deploy/tunnel/moat-proxy-agent.yaml takes
// its ID from it, and the server of moat-proxy-server.yaml (its
// --agent-identity-binding) accepts that agent as its node only: another
// node's ID or address is refused, and so is a certificate shared by every
// node, which before gave every node's agent the same identity.
func TestPerNodeCertificates(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		testenv.Require(t, "openssl (deploy/tunnel/issue-agent-cert.sh signs with it)")
	}
	p := newPKI(t)
	dir := t.TempDir()
	caKey, err := x509.MarshalECPrivateKey(p.ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "agent-ca.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: caKey}), 0o600); err != nil {
		t.Fatal(err)
	}
	issueFor := func(node string, sans ...string) (certFile, keyFile string, err error) {
		out := filepath.Join(dir, node)
		cmd := exec.Command("../../deploy/tunnel/issue-agent-cert.sh", append([]string{node}, sans...)...)
		cmd.Env = append(os.Environ(), "CA_CERT="+p.ca.CertFile, "CA_KEY="+filepath.Join(dir, "agent-ca.key"), "OUT="+out)
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("issue-agent-cert.sh %s: %v: %s", node, err, b)
		}
		return filepath.Join(out, "agent.crt"), filepath.Join(out, "agent.key"), nil
	}
	for _, bad := range [][]string{{"Node_A", "127.0.0.1"}, {"node-a", "127.0.0.1", "not a name"}, {"node-a", "fe80::1%eth0"},
		{"node-a"}, {"node-a", "node-a.example"}} { // the node's address is required
		if _, _, err := issueFor(bad[0], bad[1:]...); err == nil {
			t.Errorf("issue-agent-cert.sh %q: issued, want refused", bad)
		}
	}
	// A name too long for the CN (system:node:<name>, at most 64
	// characters) is refused saying so; before, openssl's error was
	// discarded and the script failed silently. 52 characters fit.
	long := strings.Repeat("n", 53)
	if _, _, err := issueFor(long, "127.0.0.1"); err == nil || !strings.Contains(err.Error(), "at most 52") {
		t.Errorf("issue-agent-cert.sh with a 53-character name: %v, want refused naming the limit", err)
	}
	if _, _, err := issueFor(long[:52], "127.0.0.1"); err != nil {
		t.Errorf("issue-agent-cert.sh with a 52-character name: %v", err)
	}
	certA, keyA, err := issueFor("node-a", "127.0.0.1", "Node-A.Example")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyA); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent.key: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	leaf, err := tls.LoadX509KeyPair(certA, keyA)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: p.ca.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("issued certificate is not a client certificate of the agent CA: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: p.ca.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Errorf("issued certificate also serves TLS; want client authentication only")
	}

	so, err := serveroptions.New()
	if err != nil {
		t.Fatal(err)
	}
	manifestArgs(t, "../../deploy/tunnel/moat-proxy-server.yaml", so)
	ao, err := agentoptions.New()
	if err != nil {
		t.Fatal(err)
	}
	manifestArgs(t, "../../deploy/tunnel/moat-proxy-agent.yaml", ao)
	agentID := ao.AgentIDFor(cert)
	if agentID != "node-a" {
		t.Fatalf("the manifest's agent announces %q with node-a's certificate, want node-a", agentID)
	}
	ps := startServer(t, p, serverOpts{cfg: server.Config{IdentityBinding: so.Config().IdentityBinding}})
	a := startAgent(t, p, ps.agentAddr, func(c *agent.Config) {
		c.Creds, c.AgentID, c.Identifiers = agentCreds(t, p, &testpki.Leaf{CertFile: certA, KeyFile: keyA}), agentID, ao.IdentifiersFor(cert)
	})
	eventually(t, "node-a's agent with its own certificate", a.a.Ready)
	// It claims its node's name and address (and the further name), which
	// route node-a's connections to it.
	if got, want := ao.IdentifiersFor(cert), "default-route=true&host=node-a&host=node-a.example&ipv4=127.0.0.1"; got != want {
		t.Errorf("the manifest's agent with node-a's certificate claims %q, want %q", got, want)
	}

	credsA := agentCreds(t, p, &testpki.Leaf{CertFile: certA, KeyFile: keyA})
	certB, keyB, err := issueFor("node-b", "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	credsB := agentCreds(t, p, &testpki.Leaf{CertFile: certB, KeyFile: keyB})
	md := func(id, idents string) metadata.MD {
		return metadata.Pairs(proto.MetaAgentID, id, proto.MetaAgentIdentifiers, idents)
	}
	for _, c := range []struct {
		name    string
		creds   credentials.TransportCredentials
		md      metadata.MD
		wantErr string
	}{
		{"node-a, its SANs", credsA, md("node-a", "host=node-a&host=node-a.example&ipv4=127.0.0.1&default-route=true"), ""},
		{"node-b, its SANs", credsB, md("node-b", "ipv4=127.0.0.2"), ""},
		{"node-b's certificate as node-a", credsB, md("node-a", "default-route=true"), `names node "node-b"`},
		{"node-b's certificate, node-a's address", credsB, md("node-b", "ipv4=127.0.0.1"), "identifier 127.0.0.1 is not an IP address of its certificate"},
		{"a certificate shared by every node", agentCreds(t, p, p.agent), md("node-a", "default-route=true"), "credentials name no node"},
	} {
		err := tryConnect(t, ps.agentAddr, c.creds, c.md)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.wantErr != "" && (status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%s: got %v, want PermissionDenied with %q", c.name, err, c.wantErr)
		}
	}
}

// TestDaemonSetServerFlags runs the server flags the DaemonSet's header
// lists (token authentication of its agents) through the server's option
// parsing and against a server: an agent whose token names its node is
// accepted as that node, and a token of the service account that names no
// node is refused. Before, the flags left --agent-identity-binding at auto,
// under which such a token was trusted cluster-wide: it could claim any
// node's ID and cidr=0.0.0.0/0.
func TestDaemonSetServerFlags(t *testing.T) {
	b, err := os.ReadFile("../../deploy/tunnel/moat-proxy-agent-daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, line := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(line, "#   --"); ok {
			f, _, _ = strings.Cut(f, " ")
			args = append(args, "--"+f)
		}
	}
	if len(args) == 0 {
		t.Fatal("moat-proxy-agent-daemonset.yaml lists no server flags")
	}
	so, err := serveroptions.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := flagSet("daemonset server", so.Flags()).Parse(append(args, "--cluster-cert=c", "--cluster-key=k", "--uds-name=/s", "--server-port=0")); err != nil {
		t.Fatalf("DaemonSet's server flags %q: %v", args, err)
	}
	if err := so.Validate(); err != nil {
		t.Fatalf("DaemonSet's server flags %q: %v", args, err)
	}
	if so.AgentServiceAccount == "" {
		t.Fatalf("DaemonSet's server flags %q: no token authentication", args)
	}
	p := newPKI(t)
	cfg := so.Config()
	ps := startServer(t, p, serverOpts{cfg: server.Config{Auth: boundTokens{}, IdentityBinding: cfg.IdentityBinding, Strategies: cfg.Strategies}})
	shared := agentCreds(t, p, p.agent) // the DaemonSet's agents have no certificate naming a node
	md := func(token, id, idents string) metadata.MD {
		return metadata.Pairs(proto.MetaAgentID, id, proto.MetaAuthorization, "Bearer "+token, proto.MetaAgentIdentifiers, idents)
	}
	if err := tryConnect(t, ps.agentAddr, shared, md("node-a", "node-a", "host=node-a&default-route=true")); err != nil {
		t.Errorf("token bound to node-a as node-a: %v", err)
	}
	err = tryConnect(t, ps.agentAddr, shared, md("unbound", "node-b", "cidr=0.0.0.0/0"))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "credentials name no node") {
		t.Errorf("token bound to no node: %v, want PermissionDenied (credentials name no node)", err)
	}
}
