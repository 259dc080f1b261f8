package kernel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

//go:embed init.sh
var initScript []byte

// BootModules are the modules stage one needs before it can reach the root
// file system: 9p over virtio (virtio_pci is a module on 6.1 and built in on
// 6.12) and overlayfs. Everything else is loaded later with modprobe from the
// full module tree.
var BootModules = []string{"virtio_pci", "9pnet_virtio", "9p", "overlay"}

// Busybox is the static busybox that stage one runs (Debian's busybox-static).
const Busybox = "/bin/busybox"

// ModuleFile is a module to insert, as modprobe --show-depends lists it.
type ModuleFile struct {
	// Path is the module file, possibly compressed (.ko.xz on 6.12).
	Path string
	// Params are the options from modprobe.d, space-separated.
	Params string
}

// ParseShowDepends turns the output of modprobe --show-depends into the list
// of module files to insert, dependencies first and each file once. Lines
// for built-in modules name no file and are dropped; any other line (an
// install command from modprobe.d) is an error, because inserting files
// would then not do what modprobe does.
func ParseShowDepends(out []byte) ([]ModuleFile, error) {
	var files []ModuleFile
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "insmod":
			if len(fields) < 2 {
				return nil, fmt.Errorf("modprobe --show-depends: insmod without a file: %q", sc.Text())
			}
			if !seen[fields[1]] {
				seen[fields[1]] = true
				files = append(files, ModuleFile{Path: fields[1], Params: strings.Join(fields[2:], " ")})
			}
		case "builtin":
		default:
			return nil, fmt.Errorf("modprobe --show-depends: unexpected line %q", sc.Text())
		}
	}
	return files, sc.Err()
}

// bootModuleFiles resolves BootModules with their dependencies in the
// unpacked kernel tree root.
func bootModuleFiles(ctx context.Context, root, release string) ([]ModuleFile, error) {
	args := append([]string{"-d", root, "-S", release, "--show-depends", "-a"}, BootModules...)
	cmd := exec.CommandContext(ctx, "modprobe", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("modprobe --show-depends %s: %w: %s", strings.Join(BootModules, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return ParseShowDepends(out)
}

// initramfsID names an initramfs by everything that goes into it, so that a
// change of the init script, the module set or busybox builds a new one
// next to the kernel without fetching the kernel again.
func initramfsID(modules []ModuleFile, busybox []byte) string {
	h := sha256.New()
	h.Write(initScript)
	for _, m := range modules {
		fmt.Fprintln(h, m.Path)
	}
	h.Write(busybox)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// ensureInitramfs returns the path of the initramfs for the kernel in dir,
// building it when missing. The caller holds the kernel's lock.
func ensureInitramfs(ctx context.Context, dir, release string) (string, error) {
	root := filepath.Join(dir, "root")
	modules, err := bootModuleFiles(ctx, root, release)
	if err != nil {
		return "", err
	}
	busybox, err := os.ReadFile(Busybox)
	if err != nil {
		return "", fmt.Errorf("read %s (install busybox-static): %w", Busybox, err)
	}
	if err := checkStatic(Busybox); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "initramfs-"+initramfsID(modules, busybox)+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}

	stage, err := os.MkdirTemp(dir, "initramfs-stage-")
	if err != nil {
		return "", fmt.Errorf("initramfs staging: %w", err)
	}
	defer os.RemoveAll(stage)
	for _, d := range []string{"bin", "dev", "proc", "sys", "lower", "rw", "newroot", "lib/modules"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return "", fmt.Errorf("initramfs staging: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(stage, "bin/busybox"), busybox, 0o755); err != nil {
		return "", fmt.Errorf("initramfs busybox: %w", err)
	}
	if err := os.WriteFile(filepath.Join(stage, "init"), initScript, 0o755); err != nil {
		return "", fmt.Errorf("initramfs init: %w", err)
	}
	for i, m := range modules {
		// Busybox's insmod cannot read compressed modules, and the
		// numbered names keep the dependency order under a glob.
		name := fmt.Sprintf("%02d-%s.ko", i, moduleName(m.Path))
		if err := decompressModule(ctx, m.Path, filepath.Join(stage, "lib/modules", name)); err != nil {
			return "", err
		}
	}
	tmp := path + ".tmp"
	if err := writeCpio(ctx, stage, tmp); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("install initramfs: %w", err)
	}
	removeStale(dir, path)
	return path, nil
}

// removeStale deletes initramfs archives that another version of the runner
// built. One built in the last minute is spared, since a runner of that
// version may be about to start QEMU with it (QEMU reads it whole at start);
// two versions of the runner used at once on one cache may still make one
// of them fail to boot, reported as a boot failure.
func removeStale(dir, keep string) {
	old, _ := filepath.Glob(filepath.Join(dir, "initramfs-*.cpio"))
	for _, p := range old {
		if st, err := os.Stat(p); err == nil && p != keep && time.Since(st.ModTime()) > time.Minute {
			os.Remove(p)
		}
	}
}

// moduleName strips the directory and the .ko[.xz|.zst|.gz] suffix.
func moduleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		return base[:i]
	}
	return base
}

func decompressModule(ctx context.Context, src, dst string) error {
	var tool []string
	switch {
	case strings.HasSuffix(src, ".ko"):
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("read module: %w", err)
		}
		return os.WriteFile(dst, data, 0o644)
	case strings.HasSuffix(src, ".ko.xz"):
		tool = []string{"xz", "-dc", src}
	case strings.HasSuffix(src, ".ko.zst"):
		tool = []string{"zstd", "-dcq", src}
	case strings.HasSuffix(src, ".ko.gz"):
		tool = []string{"gzip", "-dc", src}
	default:
		return fmt.Errorf("module %s: unknown compression", src)
	}
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("create module: %w", err)
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, tool[0], tool[1:]...)
	cmd.Stdout = out
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("decompress module %s: %w: %s", src, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out.Close()
}

// writeCpio packs the staging directory as an uncompressed newc archive:
// the kernel unpacks it without a decompressor, which is faster under
// software emulation than the smaller compressed archive would be.
func writeCpio(ctx context.Context, stage, out string) error {
	var names []string
	err := filepath.WalkDir(stage, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(stage, path)
		if err != nil {
			return err
		}
		names = append(names, rel)
		return nil
	})
	if err != nil {
		return fmt.Errorf("list initramfs staging: %w", err)
	}
	sort.Strings(names)
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("create initramfs: %w", err)
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "cpio", "--quiet", "-o", "-H", "newc", "-R", "0:0")
	cmd.Dir = stage
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n") + "\n")
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cpio (install cpio): %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return f.Close()
}

// checkStatic fails for a dynamically linked busybox, which cannot run from
// an initramfs that holds no C library.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; install busybox-static", path)
		}
	}
	return nil
}
