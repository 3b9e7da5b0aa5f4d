package kubetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// etcdServer is a single-member etcd on loopback with its data in a temp dir.
type etcdServer struct {
	proc      *process
	clientURL string
}

// startEtcd starts etcd under dir and waits until it reports healthy. Data
// is not fsynced: it lives only as long as the test.
func startEtcd(ctx context.Context, bin, dir string) (*etcdServer, error) {
	var lastErr error
	for attempt := range startAttempts {
		clientPort, err := freePort(loopback)
		if err != nil {
			return nil, err
		}
		peerPort, err := freePort(loopback)
		if err != nil {
			return nil, err
		}
		clientURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
		dataDir := filepath.Join(dir, "etcd-data")
		if err := os.RemoveAll(dataDir); err != nil {
			return nil, fmt.Errorf("clear etcd data dir: %w", err)
		}
		args := []string{
			"--name=kubetest",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=kubetest=" + peerURL,
			"--initial-cluster-state=new",
			"--unsafe-no-fsync",
			"--log-level=warn",
		}
		proc, err := startProcess("etcd", bin, args, filepath.Join(dir, "etcd.log"))
		if err != nil {
			return nil, err
		}
		s := &etcdServer{proc: proc, clientURL: clientURL}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = waitHTTP(wctx, &http.Client{Timeout: 2 * time.Second}, clientURL+"/health", proc, etcdHealthy)
		cancel()
		if err == nil {
			return s, nil
		}
		_ = proc.stop(5 * time.Second)
		tail := proc.logTail(20)
		lastErr = fmt.Errorf("etcd not healthy (attempt %d): %w\netcd log:\n%s", attempt+1, err, tail)
		if !portTaken(tail) {
			break
		}
	}
	return nil, lastErr
}

// etcdHealthy accepts etcd's /health answer {"health":"true"}.
func etcdHealthy(resp *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return fmt.Errorf("read etcd health: %w", err)
	}
	var h struct {
		Health string `json:"health"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return fmt.Errorf("decode etcd health %q: %w", body, err)
	}
	if resp.StatusCode != http.StatusOK || h.Health != "true" {
		return fmt.Errorf("etcd health: HTTP %d %s", resp.StatusCode, body)
	}
	return nil
}
