package nftables

import (
	"os"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Main()
	os.Exit(m.Run())
}
