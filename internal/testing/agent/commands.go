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

// Dump runs `ebpf-proxy dump -o entries` on the pins under bpffs (every
// map entry, one per line, with ids only: the form to compare across
// restarts) and returns what it prints.
func Dump(bpffs string) (string, error) {
	out, _, err := DumpWith(bpffs, "-o", "entries")
	return out, err
}

// DumpWith runs `ebpf-proxy dump --bpffs-path bpffs args...` and returns
// its stdout and stderr.
func DumpWith(bpffs string, args ...string) (stdout, stderr string, err error) {
	bin, err := Binary()
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, append([]string{"dump", "--bpffs-path", bpffs}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("ebpf-proxy dump %q: %w: %s", args, err, errOut.String())
	}
	return out.String(), errOut.String(), nil
}

// Trace runs `ebpf-proxy trace --bpffs-path bpffs args...` inside the
// network namespace at nsPath (the node's, whose devices and routes trace
// reads) and returns its stdout and stderr.
func Trace(nsPath, bpffs string, args ...string) (stdout, stderr string, err error) {
	bin, err := Binary()
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	cmd := exec.Command(bin, append([]string{"trace", "--bpffs-path", bpffs}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := netns.Start(nsPath, cmd); err != nil {
		return "", "", fmt.Errorf("ebpf-proxy trace: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return out.String(), errOut.String(), fmt.Errorf("ebpf-proxy trace %q: %w: %s", args, err, errOut.String())
	}
	return out.String(), errOut.String(), nil
}
