package cluster

import (
	"bytes"
	"os"
	"strconv"

	"github.com/ebpf-proxy/ebpf-proxy/internal/testing/agent"
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
