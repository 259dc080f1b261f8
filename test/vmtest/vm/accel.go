package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ebpf-proxy/ebpf-proxy/test/vmtest/kernel"
)

// probeTimeout bounds the KVM probe boot. A working KVM boots in about a
// second; a /dev/kvm that belongs to a different hypervisor may spin
// without output until killed.
const probeTimeout = 30 * time.Second

type probeRecord struct {
	BootID string `json:"bootID"`
	QEMU   string `json:"qemu"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason"`
}

// ChooseAccel returns AccelKVM when a probe boot of k with KVM succeeds and
// AccelTCG otherwise. The presence of /dev/kvm proves nothing: on some hosts
// it belongs to a hypervisor that runs only kernels built for it, and QEMU
// then aborts or hangs. Whether KVM works is a property of the host, so the
// probe's result is remembered in cacheDir until the host reboots. log receives one line with the decision.
func ChooseAccel(ctx context.Context, k *kernel.Kernel, qemu, cacheDir string, log io.Writer) string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return AccelTCG
	}
	f.Close()

	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	rec := probeRecord{BootID: string(bytes.TrimSpace(bootID)), QEMU: qemu}
	path := filepath.Join(cacheDir, "kvm-probe.json")
	lock, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err == nil {
		defer lock.Close()
		_ = unix.Flock(int(lock.Fd()), unix.LOCK_EX)
	}
	if data, err := os.ReadFile(path); err == nil {
		var old probeRecord
		if json.Unmarshal(data, &old) == nil && old.BootID == rec.BootID && old.QEMU == rec.QEMU {
			return accelOf(old.OK)
		}
	}

	res, err := Run(ctx, Config{Kernel: k, Accel: AccelKVM, CPUs: 1, MemoryMB: 256, Timeout: probeTimeout, QEMU: qemu},
		[]Job{{Args: []string{"/bin/true"}, Dir: "/"}})
	switch {
	case err != nil:
		rec.Reason = err.Error()
		if tail := ConsoleTail(err); tail != "" {
			rec.Reason += ": " + lastLine(tail)
		}
	case res.Jobs[0].ExitCode != 0:
		rec.Reason = fmt.Sprintf("probe command exited %d", res.Jobs[0].ExitCode)
	default:
		rec.OK = true
	}
	if ctx.Err() != nil {
		return AccelTCG
	}
	if data, err := json.MarshalIndent(rec, "", "  "); err == nil {
		_ = os.WriteFile(path, data, 0o644)
	}
	if log != nil {
		if rec.OK {
			fmt.Fprintln(log, "vmtest: KVM probe boot succeeded; using KVM")
		} else {
			fmt.Fprintf(log, "vmtest: KVM probe boot failed (%s); using software emulation\n", rec.Reason)
		}
	}
	return accelOf(rec.OK)
}

func accelOf(ok bool) string {
	if ok {
		return AccelKVM
	}
	return AccelTCG
}

func lastLine(s string) string {
	s = string(bytes.TrimSpace([]byte(s)))
	if i := bytes.LastIndexByte([]byte(s), '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
