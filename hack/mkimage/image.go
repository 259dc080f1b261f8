package main

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH of an image whose Spec sets none: the one
// container runtimes give a container whose image has no PATH.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Spec is what an image is made of. Its JSON form (with the digests of the
// inputs' contents) is the key that says whether an archive is up to date.
type Spec struct {
	// Tags name the image in the archive, as a container runtime will know
	// it ("ebpf-proxy:v1" is docker.io/library/ebpf-proxy:v1 to containerd).
	Tags []string
	// Bases are tarballs of root filesystems, the image's first layers in
	// order, used as they are (hack/rootfs.sh makes the Debian one).
	Bases []string
	// Files make one layer on top of the bases.
	Files []File
	// Entrypoint, Env and Labels go into the image's configuration. Env
	// gets PATH=DefaultPath unless it sets PATH.
	Entrypoint []string
	Env        []string
	Labels     map[string]string
	// Cmd is the image's default arguments to Entrypoint, which a pod
	// that gives no args runs with (Kubernetes' agnhost image runs
	// "pause" so). Omitted from the key when empty, so that the images
	// made before it existed keep their keys.
	Cmd []string `json:",omitempty"`
	// Created is the image's creation time and the mtime of every file the
	// Files layer holds; a fixed time makes the same inputs give the same
	// image digest.
	Created time.Time
	// Arch is the GOARCH the binaries are built for (runtime.GOARCH).
	Arch string
	// Require lists absolute paths that must be executable files in the
	// image, through any symbolic links: the archive written is read back
	// and checked (Check). The program interpreter of every dynamically
	// linked file of Files is required too (Interpreters), so that a
	// binary built with cgo cannot land in an image without its loader.
	Require []string
}

// File is a file to put into the image.
type File struct {
	// Source is the file on this machine.
	Source string
	// Dest is its absolute path in the image.
	Dest string
	// Mode is its permission bits in the image.
	Mode os.FileMode
}

// Build makes the image that spec describes.
func Build(spec Spec) (v1.Image, error) {
	if len(spec.Entrypoint) == 0 {
		return nil, fmt.Errorf("no entrypoint")
	}
	var adds []mutate.Addendum
	for _, b := range spec.Bases {
		l, err := tarball.LayerFromFile(b)
		if err != nil {
			return nil, fmt.Errorf("base layer %s: %w", b, err)
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{
			Created:   v1.Time{Time: spec.Created},
			CreatedBy: "mkimage: root filesystem " + filepath.Base(b),
		}})
	}
	if len(spec.Files) > 0 {
		l, err := filesLayer(spec.Files, spec.Created)
		if err != nil {
			return nil, err
		}
		dests := make([]string, len(spec.Files))
		for i, f := range spec.Files {
			dests[i] = f.Dest
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{
			Created:   v1.Time{Time: spec.Created},
			CreatedBy: fmt.Sprintf("mkimage: files %v", dests),
		}})
	}
	if len(adds) == 0 {
		return nil, fmt.Errorf("no layers: give a base or files")
	}
	img, err := mutate.Append(empty.Image, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = spec.Arch
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = withPath(spec.Env)
	cf.Config.Labels = spec.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// withPath returns env with PATH=DefaultPath first unless env sets PATH.
func withPath(env []string) []string {
	for _, e := range env {
		if len(e) >= 5 && e[:5] == "PATH=" {
			return env
		}
	}
	return append([]string{"PATH=" + DefaultPath}, env...)
}

// Write writes img to the docker-archive file out (what `docker save` writes
// and `ctr images import` and `docker load` read) under spec's tags. The
// file is replaced only once it is complete.
func Write(out string, tags []string, img v1.Image) error {
	if len(tags) == 0 {
		return fmt.Errorf("no tags")
	}
	refs := make(map[name.Reference]v1.Image, len(tags))
	for _, t := range tags {
		tag, err := name.NewTag(t)
		if err != nil {
			return fmt.Errorf("tag %q: %w", t, err)
		}
		refs[tag] = img
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tarball.MultiRefWrite(refs, tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// Key returns a digest of everything the image is made from: spec, the
// contents of its bases and files, and this program. The same key means the
// same archive.
func Key(spec Spec, self string) (string, error) {
	h := sha256.New()
	s := spec
	s.Tags = append([]string(nil), spec.Tags...)
	sort.Strings(s.Tags)
	if err := json.NewEncoder(h).Encode(s); err != nil {
		return "", err
	}
	inputs := append([]string{self}, spec.Bases...)
	for _, f := range spec.Files {
		inputs = append(inputs, f.Source)
	}
	for _, p := range inputs {
		if err := hashFile(h, p); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, f)
	// The length ends each input, so that no two lists of contents hash
	// alike.
	fmt.Fprintf(w, "\n%d\n", n)
	return err
}

// Check reads the image tagged tag back from the archive and checks, with
// Require, that it holds each of paths.
func Check(archive, tag string, paths []string) error {
	t, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	img, err := tarball.ImageFromPath(archive, &t)
	if err != nil {
		return fmt.Errorf("read %s back: %w", archive, err)
	}
	if _, err := img.ConfigFile(); err != nil {
		return fmt.Errorf("read %s back: %w", archive, err)
	}
	if err := Require(img, paths); err != nil {
		return fmt.Errorf("%s: %w", archive, err)
	}
	return nil
}

// Interpreters returns the program interpreters (the dynamic loaders) that
// the ELF executables among files name; static binaries and other files
// name none.
func Interpreters(files []File) ([]string, error) {
	var interps []string
	for _, f := range files {
		if ok, err := isELF(f.Source); err != nil || !ok {
			if err != nil {
				return nil, err
			}
			continue
		}
		e, err := elf.Open(f.Source)
		if err != nil {
			return nil, err
		}
		for _, p := range e.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			b, err := io.ReadAll(p.Open())
			if err != nil {
				e.Close()
				return nil, fmt.Errorf("%s: read its interpreter: %w", f.Source, err)
			}
			interps = append(interps, strings.TrimRight(string(b), "\x00"))
		}
		e.Close()
	}
	return interps, nil
}

func isELF(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	magic := make([]byte, len(elf.ELFMAG))
	if _, err := io.ReadFull(f, magic); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	return string(magic) == elf.ELFMAG, nil
}
