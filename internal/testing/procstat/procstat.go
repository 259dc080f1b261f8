// Package procstat parses /proc/PID/stat for the tests' process
// accounting: the command, the state and the CPU time.
package procstat

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of the CPU times in /proc/PID/stat: 100
// on every architecture Linux runs on today.
const ClockTicks = 100

// Stat is what the tests read of a /proc/PID/stat line.
type Stat struct {
	// Comm is the command name, without its parentheses.
	Comm string
	// State is the process state: 'R', 'S', 'D', 'Z' (a zombie), 'X'...
	State byte
	// Ticks is the user plus system CPU time, in ClockTicks.
	Ticks uint64
}

// CPU is Ticks as a duration.
func (s Stat) CPU() time.Duration { return time.Duration(s.Ticks) * time.Second / ClockTicks }

// Parse parses a /proc/PID/stat line. The command is in parentheses and
// may hold spaces and parentheses itself: the fields resume after the last
// ')'. ok is false for a line that is not one.
func Parse(line []byte) (s Stat, ok bool) {
	open, end := bytes.IndexByte(line, '('), bytes.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return s, false
	}
	// After the command: state (field 3) ... utime (14), stime (15).
	f := strings.Fields(string(line[end+1:]))
	if len(f) < 13 || len(f[0]) != 1 {
		return s, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return s, false
	}
	return Stat{Comm: string(line[open+1 : end]), State: f[0][0], Ticks: u + st}, true
}

// Read reads and parses /proc/PID/stat of pid.
func Read(pid int) (Stat, bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, false, err
	}
	s, ok := Parse(b)
	return s, ok, nil
}
