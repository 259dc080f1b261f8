package cluster

import (
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/procstat"
)

// startProcess starts bin with args, output appended to logPath. The child is
// in its own process group, so a Ctrl-C at the terminal reaches only the test
// binary, whose interrupt handler stops the child in order.
func startProcess(name, bin string, args []string, logPath string) (*agent.Process, error) {
	return agent.Start(agent.Options{Name: name, Bin: bin, Args: args, LogPath: logPath, Setpgid: true})
}

// ProcessRunning reports whether a process with this ID exists and has not
// exited. A zombie, dead but not yet reaped by its parent (for control-plane
// processes orphaned by a killed test binary, whatever reaps orphans on this
// machine), counts as exited. Process IDs are reused, so call it only for a
// process that was running a moment ago.
func ProcessRunning(pid int) bool {
	st, ok, err := procstat.Read(pid)
	if err != nil || !ok {
		return false
	}
	switch st.State {
	case 'Z', 'X', 'x':
		return false
	}
	return true
}
