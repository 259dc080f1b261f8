package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// process is one control-plane binary started by the harness.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	exited  chan struct{} // closed once Wait has returned
	waitErr error
}

// startProcess starts bin with args, output appended to logPath. The child is
// in its own process group, so a Ctrl-C at the terminal reaches only the test
// binary, whose interrupt handler stops the child in order; and it gets
// SIGKILL if the test binary dies without stopping it (go test -timeout
// panics, SIGKILL from CI).
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// From a thread kept until the child exits: the kernel ties
	// Pdeathsig to the forking thread, and the runtime ends threads.
	if err := netns.Start("", cmd); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, log: log, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		log.Close()
		close(p.exited)
	}()
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exitError reports how the process ended, or nil while it runs.
func (p *process) exitError() error {
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

// stop sends SIGTERM, so the API server shuts down the way it does on a real
// node, and SIGKILL if the process has not exited within grace. It returns
// once the process has been reaped.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.exited:
		return
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
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
}

// logTail returns the last n lines of the process's output, for error
// messages: a control plane that does not come up says why only in its log.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.logPath, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// ProcessRunning reports whether a process with this ID exists and has not
// exited. A zombie, dead but not yet reaped by its parent (for control-plane
// processes orphaned by a killed test binary, whatever reaps orphans on this
// machine), counts as exited. Process IDs are reused, so call it only for a
// process that was running a moment ago.
func ProcessRunning(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain ") ".
	i := bytes.LastIndexByte(data, ')')
	if i < 0 || i+2 >= len(data) {
		return false
	}
	switch data[i+2] {
	case 'Z', 'X', 'x':
		return false
	}
	return true
}
