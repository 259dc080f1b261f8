package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// ErrRunning is returned by Process.Wait when the process has not exited
// in time.
var ErrRunning = errors.New("process still running")

// Options say what to run and where.
type Options struct {
	// Name names the process in errors ("ebpf proxy exited: ..."); empty
	// means the program's base name.
	Name string
	// Bin is the program; empty means the agent binary (Binary).
	Bin string
	// Args are its arguments.
	Args []string
	// Env is added to the test binary's environment.
	Env []string
	// Netns is the path of the network namespace it runs in; empty means
	// the test binary's own.
	Netns string
	// LogPath is a file the output is appended to; empty keeps it in
	// memory. Long runs (10,000 Services at -v=2) log to a file.
	LogPath string
	// Setpgid puts it in a process group of its own, so that a Ctrl-C at
	// the terminal reaches only the test binary, whose interrupt handler
	// stops it in order.
	Setpgid bool
}

// Process is a program started by a test. It gets SIGKILL if the test
// binary dies without stopping it (go test -timeout panics, SIGKILL from
// CI).
type Process struct {
	name    string
	netns   string
	cmd     *exec.Cmd
	out     *syncBuffer // nil when the output goes to logPath
	logPath string
	started time.Time
	exited  chan struct{} // closed once Wait has returned
	waitErr error
	http    *http.Client
}

// Start starts the program of opts.
func Start(opts Options) (*Process, error) {
	bin := opts.Bin
	if bin == "" {
		var err error
		if bin, err = Binary(); err != nil {
			return nil, err
		}
	}
	name := opts.Name
	if name == "" {
		name = filepath.Base(bin)
	}
	p := &Process{name: name, netns: opts.Netns, logPath: opts.LogPath, exited: make(chan struct{}), http: HTTPClient(opts.Netns)}
	var out io.Writer
	var log *os.File
	if opts.LogPath == "" {
		p.out = &syncBuffer{}
		out = p.out
	} else {
		var err error
		if log, err = os.OpenFile(opts.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
			return nil, fmt.Errorf("open %s log: %w", name, err)
		}
		out = log
	}
	p.cmd = exec.Command(bin, opts.Args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if len(opts.Env) > 0 {
		p.cmd.Env = append(os.Environ(), opts.Env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: opts.Setpgid, Pdeathsig: syscall.SIGKILL}
	if err := netns.Start(opts.Netns, p.cmd); err != nil {
		if log != nil {
			log.Close()
		}
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.started = time.Now()
	go func() {
		p.waitErr = p.cmd.Wait()
		if log != nil {
			log.Close()
		}
		close(p.exited)
	}()
	return p, nil
}

// Name is the process's name in errors (Options.Name).
func (p *Process) Name() string { return p.name }

// PID is the process's ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Started is when the process was started.
func (p *Process) Started() time.Time { return p.started }

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Exited is closed once the process has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitError says how the process ended, or nil while it runs.
func (p *Process) ExitError() error {
	select {
	case <-p.exited:
		if p.waitErr == nil {
			return fmt.Errorf("%s exited with status 0", p.name)
		}
		return fmt.Errorf("%s exited: %w", p.name, p.waitErr)
	default:
		return nil
	}
}

// Wait waits up to timeout for the process to exit and returns how it
// ended (nil for status 0), or ErrRunning.
func (p *Process) Wait(timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.exited:
		return p.waitErr
	case <-t.C:
		return fmt.Errorf("%s after %v: %w", p.name, timeout, ErrRunning)
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM, so that the program shuts down the way it does on a
// real node, and SIGKILL if it has not exited within grace (or could not
// be signalled). It returns once the process has been reaped, with the
// error of signalling it, if any.
func (p *Process) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	err := p.Signal(syscall.SIGTERM)
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	if err != nil {
		_ = p.cmd.Process.Kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	return err
}

// Kill kills the process, if it still runs, and waits until it has been
// reaped.
func (p *Process) Kill() {
	if p.Running() {
		_ = p.cmd.Process.Kill()
	}
	<-p.exited
}

// Logs returns the process's output so far.
func (p *Process) Logs() string {
	if p.out != nil {
		return p.out.String()
	}
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.logPath, err)
	}
	return string(data)
}

// LogTail returns the last n lines of the process's output, for error
// messages: a program that does not come up says why only in its log.
func (p *Process) LogTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.Logs(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitLog waits up to timeout until the output holds every string of want.
// It fails early when the process exits or its output holds a string of
// fail.
func (p *Process) WaitLog(timeout time.Duration, want []string, fail ...string) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		logs := p.Logs()
		missing := ""
		for _, w := range want {
			if !strings.Contains(logs, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return nil
		}
		for _, f := range fail {
			if strings.Contains(logs, f) {
				return fmt.Errorf("%s logged %q before %q", p.name, f, missing)
			}
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before it logged %q: %v", p.name, missing, p.waitErr)
		case <-deadline.C:
			return fmt.Errorf("%s did not log %q within %v", p.name, missing, timeout)
		case <-tick.C:
		}
	}
}

// syncBuffer collects a process's output for a test to wait on.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
