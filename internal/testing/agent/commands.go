package agent

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"syscall"

	"github.com/ebpf-proxy/ebpf-proxy/internal/netns"
)

// Cleanup runs `ebpf-proxy --cleanup --bpffs-path bpffs` inside the network
// namespace at nsPath, where the agent's rules are (from the test binary's
// own namespace it would look for them on the host), and returns its
// output.
func Cleanup(ctx context.Context, nsPath, bpffs string) (string, error) {
	return runCleanup(ctx, nsPath, "--cleanup", "--bpffs-path", bpffs)
}

// CleanupCommand is Cleanup through the subcommand: `ebpf-proxy cleanup
// --bpffs-path bpffs`.
func CleanupCommand(ctx context.Context, nsPath, bpffs string) (string, error) {
	return runCleanup(ctx, nsPath, "cleanup", "--bpffs-path", bpffs)
}

func runCleanup(ctx context.Context, nsPath string, args ...string) (string, error) {
	bin, err := Binary()
	if err != nil {
		return "", err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := netns.Start(nsPath, cmd); err != nil {
		return "", fmt.Errorf("ebpf-proxy %s: %w", args[0], err)
	}
	if err := cmd.Wait(); err != nil {
		return out.String(), fmt.Errorf("ebpf-proxy %s: %w: %s", args[0], err, out.String())
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
