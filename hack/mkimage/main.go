// Command mkimage writes a container image archive from root filesystem
// tarballs and files, without a container engine or a registry: the images
// the DaemonSet and the cluster test run (`make image`, `make
// cluster-images`) are made with it on any Linux machine.
//
//	mkimage -o bin/images/ebpf-proxy-v1.tar -t ebpf-proxy:v1 \
//	    --base rootfs.tar --file bin/ebpf-proxy:/ebpf-proxy:0755 \
//	    --entrypoint /ebpf-proxy --label org.opencontainers.image.version=v1 \
//	    --require /usr/sbin/iptables
//
// --cmd gives the image's default arguments (its Cmd), which a container
// started without arguments passes to the entrypoint.
//
// The archive is in docker-archive form (`docker save`'s), which `ctr -n
// k8s.io images import`, `docker load` and `podman load` read. An archive
// whose inputs (the flags, the contents of every input file and mkimage
// itself) have not changed since it was written is left alone.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// list is a flag that may be given more than once.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	var tags, bases, files, entrypoint, cmd, env, labels, require list
	out := fs.String("o", "", "the archive to write (required)")
	fs.Var(&tags, "t", "a tag of the image, e.g. ebpf-proxy:v1 (required; repeatable)")
	fs.Var(&bases, "base", "a root filesystem tarball, a layer as it is (repeatable, in order)")
	fs.Var(&files, "file", "SRC:DEST[:MODE] a file to add at DEST, MODE octal, default SRC's (repeatable)")
	fs.Var(&entrypoint, "entrypoint", "the entrypoint, one argument per flag (required)")
	fs.Var(&cmd, "cmd", "the default arguments to the entrypoint, one per flag (the image's Cmd)")
	fs.Var(&env, "env", "KEY=VALUE in the image's environment (repeatable; PATH has a default)")
	fs.Var(&labels, "label", "KEY=VALUE a label of the image (repeatable)")
	fs.Var(&require, "require", "a path that must be an executable file in the image (repeatable)")
	created := fs.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "creation time and files' mtime, in Unix seconds (default $SOURCE_DATE_EPOCH, else 0)")
	arch := fs.String("arch", runtime.GOARCH, "the image's architecture (GOARCH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *out == "" || len(tags) == 0 || len(entrypoint) == 0 {
		return fmt.Errorf("-o, -t and --entrypoint are required")
	}
	spec := Spec{Tags: tags, Bases: bases, Entrypoint: entrypoint, Cmd: cmd, Env: env, Arch: *arch, Require: require}
	for _, f := range files {
		file, err := parseFile(f)
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, file)
	}
	if len(labels) > 0 {
		spec.Labels = map[string]string{}
		for _, l := range labels {
			k, v, ok := strings.Cut(l, "=")
			if !ok || k == "" {
				return fmt.Errorf("--label %q: want KEY=VALUE", l)
			}
			spec.Labels[k] = v
		}
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("--env %q: want KEY=VALUE", e)
		}
	}
	interps, err := Interpreters(spec.Files)
	if err != nil {
		return err
	}
	require = append(require, interps...)
	spec.Require = require
	secs := int64(0)
	if *created != "" {
		var err error
		if secs, err = strconv.ParseInt(*created, 10, 64); err != nil {
			return fmt.Errorf("--created %q: want Unix seconds", *created)
		}
	}
	spec.Created = time.Unix(secs, 0).UTC()

	start := time.Now()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	key, err := Key(spec, self)
	if err != nil {
		return err
	}
	keyFile := *out + ".key"
	if old, err := os.ReadFile(keyFile); err == nil && strings.TrimSpace(string(old)) == key {
		if _, err := os.Stat(*out); err == nil {
			fmt.Fprintf(os.Stderr, "mkimage: %s is up to date\n", *out)
			return nil
		}
	}
	img, err := Build(spec)
	if err != nil {
		return fmt.Errorf("%s: %w", *out, err)
	}
	os.Remove(keyFile)
	if err := Write(*out, tags, img); err != nil {
		return err
	}
	if err := Check(*out, tags[0], require); err != nil {
		os.Remove(*out)
		return err
	}
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o644); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "mkimage: %s: %s %s, %.1f MB, in %.1fs\n", filepath.Base(*out),
		strings.Join(tags, " "), digest, float64(st.Size())/1e6, time.Since(start).Seconds())
	return nil
}

// parseFile parses SRC:DEST[:MODE].
func parseFile(s string) (File, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return File{}, fmt.Errorf("--file %q: want SRC:DEST[:MODE]", s)
	}
	f := File{Source: parts[0], Dest: parts[1]}
	if len(parts) == 3 {
		m, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil || m > 0o777 {
			return File{}, fmt.Errorf("--file %q: mode %q is not octal permission bits", s, parts[2])
		}
		f.Mode = os.FileMode(m)
	} else {
		st, err := os.Stat(f.Source)
		if err != nil {
			return File{}, err
		}
		f.Mode = st.Mode().Perm()
	}
	return f, nil
}
