package agent

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"syscall"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Cleanup runs `ebpf-proxy --cleanup` for the pins under bpffs inside the
// network namespace at nsPath, where the agent's rules are (from the test
// binary's own namespace it would look for them on the host), and returns
// its output.
func Cleanup(ctx context.Context, nsPath, bpffs string) (string, error) {
	bin, err := Binary()
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--cleanup", "--bpffs-path", bpffs)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := netns.Start(nsPath, cmd); err != nil {
		return "", fmt.Errorf("ebpf-proxy --cleanup: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return out.String(), fmt.Errorf("ebpf-proxy --cleanup: %w: %s", err, out.String())
	}
	return out.String(), nil
}

// Dump runs `ebpf-proxy dump` on the pins under bpffs and returns what it
// prints.
func Dump(bpffs string) (string, error) {
	bin, err := Binary()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "dump", "--bpffs-path", bpffs)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ebpf-proxy dump: %w: %s", err, stderr.String())
	}
	return string(out), nil
}
