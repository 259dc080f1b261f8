package kernel

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// imagePackage matches the generic amd64 flavour of Debian's kernel image
// packages and nothing else: the cloud flavour lacks 9p, the rt flavour is a
// different scheduler, -dbg holds only symbols, and the unversioned names
// (linux-image-6.12-amd64) are metapackages that depend on a versioned one.
var imagePackage = regexp.MustCompile(`^linux-image-((\d+)\.(\d+)\.(\d+)(?:-(\d+))?(?:\+deb(\d+))?-amd64)(-unsigned)?$`)

// Candidate is one installable kernel image package as apt lists it.
type Candidate struct {
	// Package is the Debian package name, e.g. linux-image-6.1.0-56-amd64.
	Package string
	// Release is the kernel release the package installs, as uname -r
	// reports it inside the VM, e.g. 6.1.0-56-amd64.
	Release string
	// Series is major.minor, e.g. 6.1.
	Series string
	// Unsigned is set for the -unsigned variant, which carries the same
	// kernel without a secure-boot signature.
	Unsigned bool

	// order holds the numeric fields that sort releases of one series:
	// patch level, Debian ABI number, Debian release.
	order [3]int
}

// ParseCandidate reports whether name is a generic amd64 kernel image package
// and, if so, what it contains.
func ParseCandidate(name string) (Candidate, bool) {
	m := imagePackage.FindStringSubmatch(name)
	if m == nil {
		return Candidate{}, false
	}
	num := func(s string) int {
		if s == "" {
			return -1
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return -1
		}
		return n
	}
	return Candidate{
		Package:  name,
		Release:  m[1],
		Series:   m[2] + "." + m[3],
		Unsigned: m[7] != "",
		order:    [3]int{num(m[4]), num(m[5]), num(m[6])},
	}, true
}

// compare orders candidates of one series: newer releases first, and for the
// same release the signed package before the unsigned one, because the signed
// one is what Debian installs and the two carry the same kernel.
func compare(a, b Candidate) int {
	for i := range a.order {
		if c := b.order[i] - a.order[i]; c != 0 {
			return c
		}
	}
	switch {
	case a.Unsigned == b.Unsigned:
		return strings.Compare(a.Package, b.Package)
	case a.Unsigned:
		return 1
	default:
		return -1
	}
}

// Newest returns the candidates of series among names, best first: the
// newest release first and, for one release, the signed package before the
// unsigned one. Names that are not generic amd64 image packages are ignored.
// It returns an error when no name belongs to the series.
func Newest(series string, names []string) ([]Candidate, error) {
	var out []Candidate
	seen := map[string]bool{}
	for _, name := range names {
		c, ok := ParseCandidate(strings.TrimSpace(name))
		if !ok || c.Series != series || seen[c.Package] {
			continue
		}
		seen[c.Package] = true
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no linux-image-%s.*-amd64 package among %d listed", series, len(names))
	}
	slices.SortFunc(out, compare)
	return out, nil
}

// ParseSearch returns the package names from the output of apt-cache search,
// whose lines read "NAME - DESCRIPTION".
func ParseSearch(out []byte) []string {
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), " ")
		if name = strings.TrimSpace(name); name != "" {
			names = append(names, name)
		}
	}
	return names
}

// aptLists is where apt keeps the package lists that apt-cache reads.
const aptLists = "/var/lib/apt/lists"

// listsStamp identifies the current state of apt's package lists.
func listsStamp() string {
	entries, err := os.ReadDir(aptLists)
	if err != nil {
		return ""
	}
	h := sha256.New()
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || e.Name() == "lock" {
			continue
		}
		fmt.Fprintf(h, "%s %d %d\n", e.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))
}

type listing struct {
	Stamp string   `json:"stamp"`
	Names []string `json:"names"`
}

// listImagesCached is listImages remembered in cacheDir until apt's lists
// change. Where apt keeps no binary cache of its lists (Debian's container
// images disable it), every apt-cache call parses them anew, which takes
// seconds on each run of the runner.
func listImagesCached(ctx context.Context, cacheDir, series string) ([]string, error) {
	stamp := listsStamp()
	path := filepath.Join(cacheDir, "apt-"+series+".json")
	if data, err := os.ReadFile(path); err == nil && stamp != "" {
		var l listing
		if json.Unmarshal(data, &l) == nil && l.Stamp == stamp && len(l.Names) > 0 {
			return l.Names, nil
		}
	}
	names, err := listImages(ctx, series)
	if err != nil || len(names) == 0 || stamp == "" {
		return names, err
	}
	if data, err := json.Marshal(listing{Stamp: stamp, Names: names}); err == nil {
		tmp := path + fmt.Sprintf(".%d", os.Getpid())
		if os.WriteFile(tmp, data, 0o644) == nil {
			_ = os.Rename(tmp, path)
		}
	}
	return names, nil
}

// listImages asks apt-cache for the kernel image packages of series.
func listImages(ctx context.Context, series string) ([]string, error) {
	pattern := "^linux-image-" + regexp.QuoteMeta(series) + `\.`
	cmd := exec.CommandContext(ctx, "apt-cache", "search", "--names-only", pattern)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache search %s: %w: %s", pattern, err, strings.TrimSpace(stderr.String()))
	}
	return ParseSearch(out), nil
}

// aptUpdate refreshes apt's package lists. apt-cache finds nothing on a
// machine whose lists were never downloaded.
func aptUpdate(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, "apt-get", "update", "-q")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("apt-get update: %w: %s", err, tail(out, 800))
	}
	return nil
}

// aptDownload fetches the .deb of pkg into dir and returns its path.
func aptDownload(ctx context.Context, dir, pkg string) (string, error) {
	args := []string{"download", "-q"}
	if os.Geteuid() == 0 {
		// apt drops to the _apt user for downloads, which cannot write
		// into a root-owned cache directory; stay root instead of
		// loosening the directory's permissions.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	cmd := exec.CommandContext(ctx, "apt-get", append(args, pkg)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-get download %s: %w: %s", pkg, err, tail(out, 800))
	}
	debs, err := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if err != nil {
		return "", fmt.Errorf("find downloaded %s: %w", pkg, err)
	}
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s: expected one .deb in %s, found %d", pkg, dir, len(debs))
	}
	return debs[0], nil
}

// debVersion reads the Version field of a .deb.
func debVersion(ctx context.Context, deb string) (string, error) {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, "Version").Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-deb -f %s Version: %w", deb, err)
	}
	v := strings.TrimSpace(string(out))
	if v == "" {
		return "", errors.New("dpkg-deb: empty Version field in " + deb)
	}
	return v, nil
}

// tail returns the last n bytes of b as a trimmed string, for error messages.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
