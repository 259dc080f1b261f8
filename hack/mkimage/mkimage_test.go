package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one member of a test tarball.
type entry struct {
	name string
	typ  byte
	mode int64
	body string // the contents of a file, the target of a link
}

func dir(n string) entry { return entry{name: n, typ: tar.TypeDir, mode: 0o755} }
func file(n string, m int64) entry {
	return entry{name: n, typ: tar.TypeReg, mode: m, body: "contents of " + n}
}
func symlink(n, target string) entry {
	return entry{name: n, typ: tar.TypeSymlink, mode: 0o777, body: target}
}
func whiteout(dirName, n string) entry { return file(dirName+"/.wh."+n, 0o644) }

// writeTar writes a tarball of entries under t's temp directory.
func writeTar(t *testing.T, entries ...entry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode}
		switch e.typ {
		case tar.TypeReg:
			h.Size = int64(len(e.body))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = e.body
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "layer.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// debianLike is a root filesystem laid out as Debian bookworm's is (merged
// /usr, tools behind the alternatives system and /bin/kmod).
func debianLike(t *testing.T) string {
	t.Helper()
	return writeTar(t,
		dir("./"), symlink("./bin", "usr/bin"), symlink("./sbin", "usr/sbin"),
		dir("./etc/"), dir("./etc/alternatives/"),
		symlink("./etc/alternatives/iptables", "/usr/sbin/iptables-nft"),
		dir("./usr/"), dir("./usr/bin/"), file("./usr/bin/kmod", 0o755),
		dir("./usr/local/"), dir("./usr/local/bin/"),
		dir("./usr/sbin/"),
		symlink("./usr/sbin/iptables", "/etc/alternatives/iptables"),
		symlink("./usr/sbin/iptables-nft", "xtables-nft-multi"),
		file("./usr/sbin/xtables-nft-multi", 0o755),
		file("./usr/sbin/ipset", 0o755),
		symlink("./usr/sbin/modprobe", "/bin/kmod"),
		file("./etc/os-release", 0o644),
		symlink("./usr/sbin/dangling", "nowhere"),
		symlink("./usr/sbin/loop1", "loop2"), symlink("./usr/sbin/loop2", "loop1"),
	)
}

// writeFile writes a file of contents under t's temp directory.
func writeFile(t *testing.T, contents string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(p, []byte(contents), mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func agentSpec(t *testing.T) Spec {
	return Spec{
		Tags:       []string{"ebpf-proxy:v1", "registry.k8s.io/ebpf-proxy:v1-alias"},
		Bases:      []string{debianLike(t)},
		Files:      []File{{Source: writeFile(t, "the agent", 0o600), Dest: "/ebpf-proxy", Mode: 0o755}, {Source: writeFile(t, "a config", 0o644), Dest: "/etc/ebpf-proxy/config.yaml", Mode: 0o640}},
		Entrypoint: []string{"/ebpf-proxy"},
		Env:        []string{"FOO=bar"},
		Labels:     map[string]string{"org.opencontainers.image.version": "v1"},
		Created:    time.Unix(1700000000, 0).UTC(),
		Arch:       "amd64",
		Require:    []string{"/usr/sbin/iptables", "/usr/sbin/ipset", "/sbin/modprobe", "/ebpf-proxy"},
	}
}

func TestArchiveLoadsBack(t *testing.T) {
	spec := agentSpec(t)
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "images", "agent.tar")
	if err := Write(out, spec.Tags, img); err != nil {
		t.Fatal(err)
	}
	if err := Check(out, spec.Tags[0], spec.Require); err != nil {
		t.Fatal(err)
	}
	for _, tag := range spec.Tags {
		t.Run(tag, func(t *testing.T) {
			ref, err := name.NewTag(tag)
			if err != nil {
				t.Fatal(err)
			}
			loaded, err := tarball.ImageFromPath(out, &ref)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := loaded.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/ebpf-proxy"}) {
				t.Errorf("entrypoint %q", cf.Config.Entrypoint)
			}
			if want := []string{"PATH=" + DefaultPath, "FOO=bar"}; !reflect.DeepEqual(cf.Config.Env, want) {
				t.Errorf("env %q, want %q", cf.Config.Env, want)
			}
			if cf.Config.Labels["org.opencontainers.image.version"] != "v1" {
				t.Errorf("labels %v", cf.Config.Labels)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(spec.Created) {
				t.Errorf("os %q arch %q created %v", cf.OS, cf.Architecture, cf.Created)
			}
			layers, err := loaded.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != 2 || len(cf.History) != 2 {
				t.Fatalf("%d layers, %d history entries, want 2 and 2", len(layers), len(cf.History))
			}
			// The base goes in as it is.
			base, err := tarball.LayerFromFile(spec.Bases[0])
			if err != nil {
				t.Fatal(err)
			}
			if got, want := diffID(t, layers[0]), diffID(t, base); got != want {
				t.Errorf("first layer %v, want the base's %v", got, want)
			}
			want := map[string]struct {
				typ  byte
				mode int64
				body string
			}{
				"etc/":                       {tar.TypeDir, 0o755, ""},
				"etc/ebpf-proxy/":            {tar.TypeDir, 0o755, ""},
				"etc/ebpf-proxy/config.yaml": {tar.TypeReg, 0o640, "a config"},
				"ebpf-proxy":                 {tar.TypeReg, 0o755, "the agent"},
			}
			got := readLayer(t, layers[1])
			if len(got) != len(want) {
				t.Errorf("files layer holds %d entries, want %d", len(got), len(want))
			}
			for n, w := range want {
				g, ok := got[n]
				if !ok {
					t.Errorf("files layer lacks %s", n)
					continue
				}
				if g.hdr.Typeflag != w.typ || g.hdr.Mode != w.mode || g.body != w.body || g.hdr.Uid != 0 || g.hdr.Gid != 0 || !g.hdr.ModTime.Equal(spec.Created) {
					t.Errorf("%s: type %c mode %o uid %d gid %d mtime %v %q, want type %c mode %o root %v %q",
						n, g.hdr.Typeflag, g.hdr.Mode, g.hdr.Uid, g.hdr.Gid, g.hdr.ModTime, g.body, w.typ, w.mode, spec.Created, w.body)
				}
			}
		})
	}
}

func TestSameInputsSameImage(t *testing.T) {
	spec := agentSpec(t)
	digests := map[v1.Hash]bool{}
	for range 2 {
		img, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests[d] = true
	}
	if len(digests) != 1 {
		t.Errorf("two builds gave %d digests", len(digests))
	}
}

func diffID(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.DiffID()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type member struct {
	hdr  *tar.Header
	body string
}

func readLayer(t *testing.T, l v1.Layer) map[string]member {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	m := map[string]member{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return m
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		m[h.Name] = member{h, string(b)}
	}
}

func TestRequire(t *testing.T) {
	base := debianLike(t)
	// An upper layer removes ipset and makes os-release executable.
	upper := writeTar(t, whiteout("usr/sbin", "ipset"), file("etc/os-release", 0o755))
	img := image(t, base, upper)
	tests := []struct {
		name    string
		path    string
		wantErr string // in the error; "" for none
		is      error
	}{
		{"a file", "/usr/bin/kmod", "", nil},
		{"through a relative link of a directory", "/bin/kmod", "", nil},
		{"through the alternatives system", "/usr/sbin/iptables", "", nil},
		{"an absolute link through a linked directory", "/sbin/modprobe", "", nil},
		{"an upper layer's file", "/etc/os-release", "", nil},
		{"removed by a whiteout", "/usr/sbin/ipset", "no such file", ErrNotExist},
		{"missing", "/usr/sbin/ip6tables", "no such file", ErrNotExist},
		{"a dangling link", "/usr/sbin/dangling", "no such file", ErrNotExist},
		{"a loop of links", "/usr/sbin/loop1", "too many symbolic links", ErrLoop},
		{"a directory", "/usr/sbin", "not a regular file", nil},
		{"a file as a directory", "/usr/bin/kmod/x", "not a directory", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Require(img, []string{tt.path})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
	t.Run("not executable", func(t *testing.T) {
		img := image(t, writeTar(t, file("usr/bin/tool", 0o644)))
		if err := Require(img, []string{"/usr/bin/tool"}); err == nil || !strings.Contains(err.Error(), "not executable") {
			t.Fatalf("error %v, want not executable", err)
		}
	})
	t.Run("every missing path is named", func(t *testing.T) {
		err := Require(img, []string{"/a", "/usr/bin/kmod", "/b"})
		if err == nil || !strings.Contains(err.Error(), "/a") || !strings.Contains(err.Error(), "/b") {
			t.Fatalf("error %v, want /a and /b named", err)
		}
	})
}

// image stacks tarballs as layers.
func image(t *testing.T, layers ...string) v1.Image {
	t.Helper()
	img := empty.Image
	for _, p := range layers {
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

func TestFilesLayerRefuses(t *testing.T) {
	src := writeFile(t, "x", 0o644)
	tests := []struct {
		name  string
		files []File
	}{
		{"a relative destination", []File{{Source: src, Dest: "etc/x"}}},
		{"the root", []File{{Source: src, Dest: "/"}}},
		{"one destination twice", []File{{Source: src, Dest: "/x"}, {Source: src, Dest: "/x/"}}},
		{"a file where a directory must be", []File{{Source: src, Dest: "/x"}, {Source: src, Dest: "/x/y"}}},
		{"a missing source", []File{{Source: src + ".missing", Dest: "/x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := filesLayer(tt.files, time.Unix(0, 0)); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

func TestParseFile(t *testing.T) {
	src := writeFile(t, "x", 0o640)
	tests := []struct {
		arg     string
		want    File
		wantErr bool
	}{
		{src + ":/usr/local/bin/x:0755", File{Source: src, Dest: "/usr/local/bin/x", Mode: 0o755}, false},
		{src + ":/x", File{Source: src, Dest: "/x", Mode: 0o640}, false},
		{src, File{}, true},
		{src + ":/x:rwx", File{}, true},
		{src + ":/x:4755", File{}, true},
		{":/x:0755", File{}, true},
		{src + ":/x:0755:1", File{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.arg, func(t *testing.T) {
			got, err := parseFile(tt.arg)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseFile = %+v, %v; want %+v, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// TestRun goes through the command: an archive is written, left alone when
// nothing changed, rewritten when an input did, and refused (and removed)
// when the image lacks a required file.
func TestRun(t *testing.T) {
	base := debianLike(t)
	bin := writeFile(t, "v1", 0o755)
	out := filepath.Join(t.TempDir(), "agent.tar")
	args := func(extra ...string) []string {
		return append([]string{"-o", out, "-t", "ebpf-proxy:v1", "--base", base, "--file", bin + ":/ebpf-proxy:0755",
			"--entrypoint", "/ebpf-proxy", "--label", "org.opencontainers.image.version=v1", "--created", "1700000000",
			"--require", "/sbin/modprobe", "--require", "/ebpf-proxy"}, extra...)
	}
	if err := run(args()); err != nil {
		t.Fatal(err)
	}
	st1 := stat(t, out)
	if err := run(args()); err != nil {
		t.Fatal(err)
	}
	if st2 := stat(t, out); !st2.ModTime().Equal(st1.ModTime()) {
		t.Error("an up-to-date archive was rewritten")
	}
	if err := os.WriteFile(bin, []byte("v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := run(args()); err != nil {
		t.Fatal(err)
	}
	if st3 := stat(t, out); os.SameFile(st1, st3) {
		t.Error("the archive was not rewritten when the binary changed")
	}
	if err := run(args("--require", "/usr/sbin/ip6tables")); err == nil || !strings.Contains(err.Error(), "/usr/sbin/ip6tables") {
		t.Fatalf("error %v, want one naming /usr/sbin/ip6tables", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("an archive that fails its check is left behind: %v", err)
	}
	for _, bad := range [][]string{
		{"-o", out, "-t", "x:1"},
		{"-t", "x:1", "--entrypoint", "/x"},
		{"-o", out, "-t", "x:1", "--entrypoint", "/x", "--label", "nokey"},
		{"-o", out, "-t", "x:1", "--entrypoint", "/x", "--created", "yesterday"},
		{"-o", out, "-t", "x:1", "--entrypoint", "/x", "stray"},
		{"-o", out, "-t", "x:1", "--entrypoint", "/x"}, // no layers
	} {
		if err := run(bad); err == nil {
			t.Errorf("run(%q): no error", bad)
		}
	}
}

func stat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestInterpreters(t *testing.T) {
	dynamic, err := exec.LookPath("true")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Interpreters([]File{{Source: writeFile(t, "#!/bin/sh\n", 0o755)}, {Source: dynamic}})
	if err != nil {
		t.Fatal(err)
	}
	// Debian's coreutils are linked dynamically, against glibc's loader.
	if len(got) != 1 || !strings.HasPrefix(got[0], "/lib") || !strings.Contains(got[0], "ld-") {
		t.Fatalf("interpreters %q, want the one of %s", got, dynamic)
	}
	// An image without the loader is refused.
	out := filepath.Join(t.TempDir(), "x.tar")
	err = run([]string{"-o", out, "-t", "x:1", "--base", debianLike(t), "--file", dynamic + ":/true:0755", "--entrypoint", "/true"})
	if err == nil || !strings.Contains(err.Error(), got[0]) {
		t.Fatalf("error %v, want one naming %s", err, got[0])
	}
}

// TestCmd checks that --cmd becomes the image's Cmd, one argument per flag
// after the entrypoint, and that an image made without it has none: a pod
// with no args runs the entrypoint with the Cmd (agnhost's "pause"), and
// the images made before the flag existed must not change.
func TestCmd(t *testing.T) {
	base := debianLike(t)
	bin := writeFile(t, "agnhost", 0o755)
	for _, tc := range []struct {
		name string
		cmd  []string
	}{
		{"none", nil},
		{"one", []string{"pause"}},
		{"two", []string{"netexec", "--http-port=8080"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "agnhost.tar")
			args := []string{"-o", out, "-t", "registry.k8s.io/e2e-test-images/agnhost:2.66.1", "--base", base,
				"--file", bin + ":/agnhost:0755", "--entrypoint", "/agnhost", "--require", "/agnhost"}
			for _, c := range tc.cmd {
				args = append(args, "--cmd", c)
			}
			if err := run(args); err != nil {
				t.Fatal(err)
			}
			ref, err := name.NewTag("registry.k8s.io/e2e-test-images/agnhost:2.66.1")
			if err != nil {
				t.Fatal(err)
			}
			img, err := tarball.ImageFromPath(out, &ref)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cf.Config.Cmd, tc.cmd) {
				t.Errorf("Cmd %q, want %q", cf.Config.Cmd, tc.cmd)
			}
			if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/agnhost"}) {
				t.Errorf("entrypoint %q", cf.Config.Entrypoint)
			}
		})
	}
	// A spec without Cmd keys as it did before the field existed.
	var b strings.Builder
	if err := json.NewEncoder(&b).Encode(Spec{Tags: []string{"x:1"}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "Cmd") {
		t.Errorf("a spec without Cmd encodes it: %s", b.String())
	}
}
