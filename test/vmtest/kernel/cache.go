// Package kernel fetches Debian's kernel packages without installing them and
// prepares them for booting in QEMU: it unpacks the package, runs depmod,
// extracts an uncompressed vmlinux from the bzImage and builds a small
// initramfs. Everything lives in one cache directory that later runs reuse, so
// that a second run downloads nothing.
//
// Layout of the cache directory:
//
//	kernels/<release>/kernel.json          what the directory holds; written last
//	kernels/<release>/root/                the unpacked package, depmod'ed
//	kernels/<release>/vmlinux              the uncompressed kernel
//	kernels/<release>/initramfs-<id>.cpio  stage one of the guest
//	kernels/<release>.lock                 serialises preparation across processes
package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// Kernel is a kernel ready to boot.
type Kernel struct {
	// Package is the Debian package it came from.
	Package string `json:"package"`
	// DebVersion is that package's version, e.g. 6.1.192-2.
	DebVersion string `json:"debVersion"`
	// Release is the kernel release (uname -r), e.g. 6.1.0-56-amd64.
	Release string `json:"release"`
	// Series is major.minor, e.g. 6.1.
	Series string `json:"series"`

	// Dir is the kernel's directory in the cache.
	Dir string `json:"-"`
	// Vmlinux is the uncompressed ELF kernel.
	Vmlinux string `json:"-"`
	// Initramfs is the uncompressed cpio archive of stage one.
	Initramfs string `json:"-"`
	// ModulesDir is the unpacked /lib/modules/<release>.
	ModulesDir string `json:"-"`
	// BootDir is the unpacked /boot (config and System.map).
	BootDir string `json:"-"`
}

// Upstream returns the upstream kernel version, e.g. 6.1.192 for the Debian
// version 6.1.192-2.
func (k *Kernel) Upstream() string {
	v, _, _ := strings.Cut(k.DebVersion, "-")
	return v
}

// Cache is the directory that holds prepared kernels.
type Cache struct {
	// Dir is the cache directory; see DefaultDir.
	Dir string
	// Log receives one line per slow step (download, unpack), so that a
	// cold run does not look stuck. Nil discards.
	Log io.Writer
}

// DefaultDir is ${EBPF_PROXY_CACHE:-/var/cache/ebpf-proxy}/vmtest.
func DefaultDir() string {
	base := os.Getenv("EBPF_PROXY_CACHE")
	if base == "" {
		base = "/var/cache/ebpf-proxy"
	}
	return filepath.Join(base, "vmtest")
}

var (
	seriesSpec  = regexp.MustCompile(`^\d+\.\d+$`)
	releaseSpec = regexp.MustCompile(`^(\d+\.\d+)\.\d+.*-amd64$`)
)

// Get returns the kernel that spec names, fetching and preparing it when the
// cache lacks it. spec is either a series ("6.1", "6.12"), which selects the
// newest generic amd64 kernel of that series that apt lists, or an exact
// release ("6.1.0-56-amd64"). When apt cannot list or download a series, the
// newest kernel of that series already in the cache is used instead.
func (c *Cache) Get(ctx context.Context, spec string) (*Kernel, error) {
	if err := os.MkdirAll(filepath.Join(c.Dir, "kernels"), 0o755); err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}
	switch {
	case seriesSpec.MatchString(spec):
		return c.getSeries(ctx, spec)
	case releaseSpec.MatchString(spec):
		cand, ok := ParseCandidate("linux-image-" + spec)
		if !ok {
			return nil, fmt.Errorf("kernel %q: not a generic amd64 release", spec)
		}
		return c.getCandidate(ctx, cand)
	default:
		return nil, fmt.Errorf("kernel %q: want a series like 6.1 or a release like 6.1.0-56-amd64", spec)
	}
}

func (c *Cache) getSeries(ctx context.Context, series string) (*Kernel, error) {
	cands, listErr := c.candidates(ctx, series)
	var errs []error
	if listErr != nil {
		errs = append(errs, listErr)
	}
	// A download can fail for the newest package while its files are
	// still being published; an older one is a usable stand-in.
	for i, cand := range cands {
		if i == 3 {
			break
		}
		k, err := c.getCandidate(ctx, cand)
		if err == nil {
			return k, nil
		}
		errs = append(errs, err)
		c.logf("vmtest: kernel %s: %v", cand.Release, err)
	}
	cached, err := c.cachedReleases(series)
	if err == nil && len(cached) > 0 {
		c.logf("vmtest: using cached kernel %s: apt has no usable %s package", cached[0].Release, series)
		return c.getCandidate(ctx, cached[0])
	}
	return nil, fmt.Errorf("kernel series %s: %w", series, errors.Join(errs...))
}

// candidates lists the series' packages, updating apt's lists once when they
// hold none (a fresh machine has no lists at all).
func (c *Cache) candidates(ctx context.Context, series string) ([]Candidate, error) {
	names, err := listImagesCached(ctx, c.Dir, series)
	if err != nil {
		return nil, err
	}
	cands, err := Newest(series, names)
	if err == nil {
		return cands, nil
	}
	unlock, lerr := lockFile(filepath.Join(c.Dir, "apt.lock"))
	if lerr != nil {
		return nil, lerr
	}
	defer unlock()
	// Another process may have updated the lists while this one waited.
	if names, err = listImages(ctx, series); err == nil {
		if cands, err = Newest(series, names); err == nil {
			return cands, nil
		}
	}
	c.logf("vmtest: apt lists no %s kernel; running apt-get update", series)
	if err := aptUpdate(ctx); err != nil {
		return nil, err
	}
	if names, err = listImagesCached(ctx, c.Dir, series); err != nil {
		return nil, err
	}
	return Newest(series, names)
}

// cachedReleases returns the completed kernels of series in the cache, newest
// first.
func (c *Cache) cachedReleases(series string) ([]Candidate, error) {
	entries, err := os.ReadDir(filepath.Join(c.Dir, "kernels"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		k, err := c.load(e.Name())
		if err == nil && k.Series == series {
			names = append(names, k.Package)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	return Newest(series, names)
}

func (c *Cache) kernelDir(release string) string {
	return filepath.Join(c.Dir, "kernels", release)
}

// load reads a completed kernel directory. kernel.json is written after
// everything else, so its presence marks the directory as complete.
func (c *Cache) load(release string) (*Kernel, error) {
	dir := c.kernelDir(release)
	data, err := os.ReadFile(filepath.Join(dir, "kernel.json"))
	if err != nil {
		return nil, err
	}
	var k Kernel
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s/kernel.json: %w", dir, err)
	}
	if k.Release != release {
		return nil, fmt.Errorf("%s/kernel.json: release %q does not match the directory", dir, k.Release)
	}
	k.Dir = dir
	k.Vmlinux = filepath.Join(dir, "vmlinux")
	k.ModulesDir = filepath.Join(dir, "root/lib/modules", release)
	k.BootDir = filepath.Join(dir, "root/boot")
	return &k, nil
}

func (c *Cache) getCandidate(ctx context.Context, cand Candidate) (*Kernel, error) {
	unlock, err := lockFile(c.kernelDir(cand.Release) + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	k, err := c.load(cand.Release)
	if errors.Is(err, os.ErrNotExist) {
		if err = c.fetch(ctx, cand); err == nil {
			k, err = c.load(cand.Release)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", cand.Release, err)
	}
	if k.Initramfs, err = ensureInitramfs(ctx, k.Dir, k.Release); err != nil {
		return nil, fmt.Errorf("kernel %s: initramfs: %w", k.Release, err)
	}
	return k, nil
}

// fetch downloads and prepares cand in a scratch directory and renames it
// into place, so that an interrupted fetch never leaves a directory that
// looks complete. The caller holds the kernel's lock.
func (c *Cache) fetch(ctx context.Context, cand Candidate) error {
	final := c.kernelDir(cand.Release)
	scratch := final + ".partial"
	if err := os.RemoveAll(scratch); err != nil {
		return fmt.Errorf("remove stale %s: %w", scratch, err)
	}
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("remove incomplete %s: %w", final, err)
	}
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(scratch)

	c.logf("vmtest: downloading %s", cand.Package)
	deb, err := aptDownload(ctx, scratch, cand.Package)
	if err != nil {
		return err
	}
	version, err := debVersion(ctx, deb)
	if err != nil {
		return err
	}
	c.logf("vmtest: unpacking %s %s", cand.Package, version)
	root := filepath.Join(scratch, "root")
	if err := run(ctx, "dpkg", "-x", deb, root); err != nil {
		return err
	}
	if err := os.Remove(deb); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "lib/modules", cand.Release)); err != nil {
		return fmt.Errorf("%s does not hold modules for %s: %w", cand.Package, cand.Release, err)
	}
	if err := run(ctx, "depmod", "-b", root, cand.Release); err != nil {
		return err
	}
	bz := filepath.Join(root, "boot", "vmlinuz-"+cand.Release)
	if err := ExtractVmlinux(ctx, bz, filepath.Join(scratch, "vmlinux")); err != nil {
		return err
	}
	meta, err := json.MarshalIndent(Kernel{
		Package:    cand.Package,
		DebVersion: version,
		Release:    cand.Release,
		Series:     cand.Series,
	}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(scratch, "kernel.json"), append(meta, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.Rename(scratch, final); err != nil {
		return fmt.Errorf("install %s: %w", final, err)
	}
	return nil
}

func (c *Cache) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(out, 800))
	}
	return nil
}

// lockFile takes an exclusive flock on path, waiting for other processes
// (parallel kernels of one matrix, parallel go test -exec runs) to finish
// preparing the same kernel.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
