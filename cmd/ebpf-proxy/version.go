package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/ebpf-proxy/ebpf-proxy/internal/bpfobj"
)

// version and commit are set at link time (make build does:
// -ldflags "-X main.version=... -X main.commit=..."); without them the
// version is "devel" and the commit the one the Go toolchain stamped, if
// any.
var version, commit = "devel", ""

// buildInfo is what `ebpf-proxy version` prints.
type buildInfo struct {
	Version, Commit, CommitTime, GoVersion, Platform, BPFObjects string
	// Modified: the commit's tree had uncommitted changes when built.
	Modified bool
}

// readBuildInfo reads the version control facts the Go toolchain stamped
// into the binary (when it was built from a git checkout).
func readBuildInfo() buildInfo {
	bi := buildInfo{Version: version, Commit: commit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, BPFObjects: bpfobj.ObjectsHash()}
	info, ok := debug.ReadBuildInfo()
	if commit != "" {
		return bi
	}
	bi.Commit = "unknown"
	if !ok {
		return bi
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			bi.Commit = s.Value
		case "vcs.time":
			bi.CommitTime = s.Value
		case "vcs.modified":
			bi.Modified = s.Value == "true"
		}
	}
	return bi
}

func printVersion(w io.Writer) error {
	bi := readBuildInfo()
	commit := bi.Commit
	if bi.Modified {
		commit += " (with uncommitted changes)"
	}
	if bi.CommitTime != "" {
		commit += " of " + bi.CommitTime
	}
	_, err := fmt.Fprintf(w, "ebpf-proxy %s\n  commit:      %s\n  go:          %s %s\n  bpf objects: sha256:%s\n",
		bi.Version, commit, bi.GoVersion, bi.Platform, bi.BPFObjects)
	return err
}
