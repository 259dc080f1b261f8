package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// maxLinks is how many symbolic links a path may go through, as Linux's
// limit (ELOOP past 40).
const maxLinks = 40

// Errors of Lookup.
var (
	// ErrNotExist is returned for a path that is not in the image.
	ErrNotExist = errors.New("no such file")
	// ErrLoop is returned for a path through more than 40 symbolic links.
	ErrLoop = errors.New("too many symbolic links")
)

// FS is the file tree of an image: its layers applied in order, with
// whiteouts, as a container sees it. Only the tar headers are kept.
type FS map[string]*tar.Header

// ReadFS reads img's file tree.
func ReadFS(img v1.Image) (FS, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	fs := FS{"/": {Typeflag: tar.TypeDir, Name: "/", Mode: 0o755}}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the image's files: %w", err)
		}
		p := path.Join("/", h.Name)
		fs[p] = h
		// A tarball need not list the directories it puts files in.
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := fs[d]; ok {
				break
			}
			fs[d] = &tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}
		}
	}
}

// Lookup returns the path p leads to, following symbolic links in every
// component as the kernel would in a container of the image, and that
// file's header. It returns ErrNotExist or ErrLoop wrapped with p.
func (fs FS) Lookup(p string) (string, *tar.Header, error) {
	parts := split(p)
	cur := "/"
	links := 0
	for i := 0; i < len(parts); i++ {
		next := path.Join(cur, parts[i])
		h, ok := fs[next]
		if !ok {
			return "", nil, fmt.Errorf("%s: %s: %w", p, next, ErrNotExist)
		}
		switch h.Typeflag {
		case tar.TypeSymlink:
			if links++; links > maxLinks {
				return "", nil, fmt.Errorf("%s: %w", p, ErrLoop)
			}
			target := h.Linkname
			if !path.IsAbs(target) {
				target = path.Join(cur, target)
			}
			parts = append(split(target), parts[i+1:]...)
			cur, i = "/", -1
			continue
		case tar.TypeDir:
		default:
			if i < len(parts)-1 {
				return "", nil, fmt.Errorf("%s: %s is not a directory", p, next)
			}
		}
		cur = next
	}
	return cur, fs[cur], nil
}

func split(p string) []string {
	p = strings.Trim(path.Clean("/"+p), "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// Require checks that each of paths is, through any symbolic links, an
// executable regular file in img; the error names every one that is not.
func Require(img v1.Image, paths []string) error {
	if len(paths) == 0 {
		return nil
	}
	fs, err := ReadFS(img)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range paths {
		real, h, err := fs.Lookup(p)
		switch {
		case err != nil:
			errs = append(errs, err)
		case h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeLink:
			errs = append(errs, fmt.Errorf("%s: %s is not a regular file", p, real))
		case h.Mode&0o111 == 0:
			errs = append(errs, fmt.Errorf("%s: %s is not executable (mode %o)", p, real, h.Mode))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("the image lacks what it must hold: %w", errors.Join(errs...))
	}
	return nil
}
