package procstat

import (
	"os"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		name, line string
		want       Stat
		ok         bool
	}{
		{"plain", "42 (kubelet) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 5 0 0", Stat{"kubelet", 'S', 300}, true},
		{"a command with spaces and parentheses", "7 (a) b (c) Z 1 7 7 0 -1 0 0 0 0 0 3 4 0 0", Stat{"a) b (c", 'Z', 7}, true},
		{"truncated", "7 (x) R 1 2 3", Stat{}, false},
		{"no command", "7 x R 1 2 3 4 5 6 7 8 9 10 11 12 13", Stat{}, false},
		{"not a number", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 u 4 0 0", Stat{}, false},
	} {
		got, ok := Parse([]byte(tt.line))
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: Parse = %+v, %v; want %+v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
	if d := (Stat{Ticks: 250}).CPU(); d != 2500*time.Millisecond {
		t.Errorf("CPU of 250 ticks = %v", d)
	}
}

func TestReadOwnProcess(t *testing.T) {
	st, ok, err := Read(os.Getpid())
	if err != nil || !ok {
		t.Fatalf("Read(self) = %+v, %v, %v", st, ok, err)
	}
	if st.State != 'R' && st.State != 'S' {
		t.Errorf("own state %q", st.State)
	}
}
