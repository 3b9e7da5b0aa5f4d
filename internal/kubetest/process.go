package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// process is one child (etcd or kube-apiserver) in its own process group,
// with its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process has exited
	waitErr error         // valid after done is closed
}

// startProcess starts path with args in a new process group, sending
// stdout and stderr to logPath.
//
// The child gets SIGKILL if the thread that forked it dies (Pdeathsig), so a
// test binary killed by a timeout does not leak servers. Pdeathsig follows
// the forking OS thread, not the process, and Go may retire threads (for
// example when another goroutine exits while locked to one after switching
// network namespaces), so the fork happens on a goroutine that stays locked
// to its thread until the child has exited.
func startProcess(name, path string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout = logFile
	p.cmd.Stderr = logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine, after the child.
		if err := p.cmd.Start(); err != nil {
			started <- err
			logFile.Close()
			close(p.done)
			return
		}
		started <- nil
		p.waitErr = p.cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace (at
// once when grace is 0), and
// waits for the process to be reaped. It is safe to call more than once.
func (p *process) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	pgid := p.cmd.Process.Pid
	sig := syscall.SIGTERM
	if grace <= 0 {
		sig = syscall.SIGKILL
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Anything else left in the group (there should be nothing) goes too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}

// logTail returns the last n lines of the process log, for failure reports.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s log: %v)", p.name, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
