package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// filesLayer makes a layer of files, owned by root, with their parent
// directories (mode 0755), every entry's mtime set to mtime and the entries
// sorted by name: the same files give the same layer.
func filesLayer(files []File, mtime time.Time) (v1.Layer, error) {
	type entry struct {
		hdr  tar.Header
		data []byte
	}
	entries := map[string]entry{}
	for _, f := range files {
		if !path.IsAbs(f.Dest) || path.Clean(f.Dest) == "/" {
			return nil, fmt.Errorf("destination %q: not an absolute path of a file", f.Dest)
		}
		name := strings.TrimPrefix(path.Clean(f.Dest), "/")
		if _, ok := entries[name]; ok {
			return nil, fmt.Errorf("destination %q given twice", f.Dest)
		}
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, err
		}
		entries[name] = entry{hdr: tar.Header{
			Typeflag: tar.TypeReg, Name: name, Size: int64(len(data)),
			Mode: int64(f.Mode.Perm()), ModTime: mtime,
		}, data: data}
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if e, ok := entries[d+"/"]; ok && e.hdr.Typeflag == tar.TypeDir {
				break
			}
			entries[d+"/"] = entry{hdr: tar.Header{
				Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755,
				ModTime: mtime,
			}}
		}
	}
	for name := range entries {
		if strings.HasSuffix(name, "/") {
			if _, ok := entries[strings.TrimSuffix(name, "/")]; ok {
				return nil, fmt.Errorf("%s is both a file and a directory", name)
			}
		}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", n, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithCompressedCaching)
}
