package ipvs

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

func TestStrictARP(t *testing.T) {
	root := t.TempDir()
	for _, n := range []string{"arp_ignore", "arp_announce"} {
		p := filepath.Join(root, "net/ipv4/conf/all", n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sys := sysctl.Sysctl{Root: root}
	if err := ApplyStrictARP(sys, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	for n, want := range map[string]int{"net.ipv4.conf.all.arp_ignore": 1, "net.ipv4.conf.all.arp_announce": 2} {
		if got, err := sys.GetInt(n); err != nil || got != want {
			t.Errorf("%s = %d (%v), want %d", n, got, err, want)
		}
	}
}
