package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/guest"
	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
)

// TestForwarderPassesWholeLines checks that output two streams share never
// interleaves mid-line: only complete lines go out until the run ends.
func TestForwarderPassesWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.stdout")
	var out bytes.Buffer
	f, err := newForwarder(path, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	guestFile, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { guestFile.Close() })

	steps := []struct {
		write string
		final bool
		want  string
	}{
		{write: "=== RUN   Te", want: ""},
		{write: "stA\n--- PASS: Te", want: "=== RUN   TestA\n"},
		{write: "stA (0.00s)\nPASS\n", want: "=== RUN   TestA\n--- PASS: TestA (0.00s)\nPASS\n"},
		{write: "no newline at the end", final: true, want: "=== RUN   TestA\n--- PASS: TestA (0.00s)\nPASS\nno newline at the end"},
	}
	for i, s := range steps {
		if _, err := guestFile.WriteString(s.write); err != nil {
			t.Fatal(err)
		}
		f.poll(s.final)
		if out.String() != s.want {
			t.Fatalf("after step %d forwarded %q, want %q", i, out.String(), s.want)
		}
	}
}

func TestSameWriter(t *testing.T) {
	var a, b bytes.Buffer
	tests := []struct {
		name string
		x, y interface {
			Write([]byte) (int, error)
		}
		want bool
	}{
		{"same pointer", &a, &a, true},
		{"different pointers", &a, &b, false},
		{"nil", nil, nil, false},
		{"uncomparable values do not panic", sliceWriter{}, sliceWriter{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameWriter(tt.x, tt.y); got != tt.want {
				t.Errorf("sameWriter = %v, want %v", got, tt.want)
			}
		})
	}
}

type sliceWriter []byte

func (sliceWriter) Write(p []byte) (int, error) { return len(p), nil }

func TestQEMUArgs(t *testing.T) {
	k := &kernel.Kernel{Vmlinux: "/c/vmlinux", Initramfs: "/c/initramfs.cpio"}
	tests := []struct {
		name  string
		cfg   Config
		share []guest.Share
		want  []string
		err   bool
	}{
		{
			name: "software emulation with the host root read-only and the run share",
			cfg:  Config{Kernel: k, Accel: AccelTCG, CPUs: 2, MemoryMB: 512, BIOS: "/nonexistent"},
			want: []string{
				"-accel tcg,thread=multi -cpu qemu64", "-smp 2", "-m 512M",
				"-virtfs local,path=/,mount_tag=root,security_model=none,multidevs=remap,readonly=on",
				"-virtfs local,path=/tmp/run,mount_tag=run,security_model=none,multidevs=remap",
				"vmtest.run=/tmp/run",
			},
		},
		{
			name:  "KVM; a comma in a shared path is escaped",
			cfg:   Config{Kernel: k, Accel: AccelKVM, CPUs: 1, MemoryMB: 256, BIOS: "/nonexistent"},
			share: []guest.Share{{Tag: "rw0", Path: "/tmp/a,b"}},
			want:  []string{"-accel kvm -cpu host", "-virtfs local,path=/tmp/a,,b,mount_tag=rw0,security_model=none,multidevs=remap"},
		},
		{
			name: "a network card on a tap device",
			cfg:  Config{Kernel: k, Accel: AccelTCG, CPUs: 1, MemoryMB: 256, BIOS: "/nonexistent", Tap: "node-tap"},
			want: []string{"-netdev tap,id=net0,ifname=node-tap,script=no,downscript=no -device virtio-net-pci,netdev=net0,mac=" + TapMAC("node-tap").String()},
		},
		{
			name: "a tap device name QEMU would read as options",
			cfg:  Config{Kernel: k, Accel: AccelTCG, Tap: "a,script=/x"},
			err:  true,
		},
		{
			name: "unknown accelerator",
			cfg:  Config{Kernel: k, Accel: "hvf"},
			err:  true,
		},
	}
	if a, b := TapMAC("node1-tap"), TapMAC("node2-tap"); bytes.Equal(a, b) || a[0] != 0x52 {
		t.Errorf("TapMAC: node1-tap %s, node2-tap %s: want two addresses of QEMU's prefix 52:54:00", a, b)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args, err := qemuArgs(tt.cfg, "/tmp/run", tt.share)
			if tt.err {
				if err == nil {
					t.Fatalf("qemuArgs = %q, want an error", args)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			line := strings.Join(args, " ")
			for _, w := range tt.want {
				if !strings.Contains(line, w) {
					t.Errorf("QEMU command line lacks %q:\n%s", w, line)
				}
			}
			if tt.cfg.Tap == "" && slices.Contains(args, "-netdev") {
				t.Errorf("a network card without Config.Tap:\n%s", line)
			}
			if slices.Contains(args, "-bios") {
				t.Errorf("-bios given for a firmware file that does not exist")
			}
		})
	}
}
