package kubetest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// apiServer is one kube-apiserver process and the flags it was started with,
// kept so the same server (same address, same etcd) can be started again.
type apiServer struct {
	bin  string
	dir  string
	args []string
	addr netip.AddrPort
	proc *process
}

// apiServerArgs are the flags for a test server. Every choice is explained
// because each works around the absence of a real control plane.
func apiServerArgs(addr netip.AddrPort, etcdURL, dir string, p *apiServerPKI, tokenFile string, o *options) []string {
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + addr.Addr().String(),
		"--secure-port=" + strconv.Itoa(int(addr.Port())),
		// 1.37 exits with an explicit loopback advertise address unless the
		// endpoint reconciler is off (there is no Service routing anyway).
		"--advertise-address=" + addr.Addr().String(),
		"--endpoint-reconciler-type=none",
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=Node,RBAC",
		// TokenRequest (ServiceAccountConfig) needs an issuer and a key.
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.serviceAccount,
		"--service-account-signing-key-file=" + p.serviceAccount,
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controller manager creates the "default" ServiceAccount, so the
		// plugin would reject every Pod.
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
	}
	return append(args, o.apiServerArgs...)
}

// start runs the server and waits until /readyz answers 200 for admin.
func (s *apiServer) start(ctx context.Context, httpClient *http.Client, timeout time.Duration) error {
	proc, err := startProcess("kube-apiserver", s.bin, s.args, filepath.Join(s.dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	s.proc = proc
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := "https://" + s.addr.String() + "/readyz"
	if err := waitHTTP(wctx, httpClient, url, proc, readyzOK); err != nil {
		_ = s.stop()
		return fmt.Errorf("kube-apiserver not ready: %w\nkube-apiserver log:\n%s", err, proc.logTail(30))
	}
	return nil
}

// stop ends the server. kube-apiserver can take several seconds to drain;
// after the grace period it is killed.
func (s *apiServer) stop() error {
	if s.proc == nil {
		return nil
	}
	return s.proc.stop(15 * time.Second)
}

// kill ends the server at once (SIGKILL), without draining.
func (s *apiServer) kill() error {
	if s.proc == nil {
		return nil
	}
	return s.proc.stop(0)
}

func readyzOK(resp *http.Response) error {
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 8192))
	// Keep only the failing checks of the verbose answer.
	var failing []string
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.Contains(line, "failed") {
			failing = append(failing, strings.TrimSpace(line))
		}
	}
	return fmt.Errorf("/readyz HTTP %d %s", resp.StatusCode, strings.Join(failing, "; "))
}
