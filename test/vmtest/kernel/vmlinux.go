package kernel

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
)

// Offsets into the x86 boot protocol header of a bzImage
// (Documentation/arch/x86/boot.rst).
const (
	offSetupSects    = 0x1f1
	offHeaderMagic   = 0x202
	offVersion       = 0x206
	offPayloadOffset = 0x248
	offPayloadLength = 0x24c
	headerEnd        = 0x250
	// minVersion is the first boot protocol with payload_offset/length.
	minVersion = 0x0208
)

// Payload is the compressed kernel inside a bzImage.
type Payload struct {
	// Format is the compressor: "gzip", "xz" or "zstd".
	Format string
	// Data is the compressed stream, without the size trailer that the
	// kernel build appends after xz and zstd streams.
	Data []byte
	// Size is the length of the decompressed ELF image, from the trailer.
	Size uint32
}

var magics = []struct {
	format string
	magic  []byte
}{
	{"gzip", []byte{0x1f, 0x8b}},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
}

// ParseBzImage finds the compressed vmlinux inside a bzImage. QEMU boots the
// uncompressed ELF much faster than the bzImage under software emulation,
// where the kernel's own decompressor costs seconds on every boot.
func ParseBzImage(bz []byte) (Payload, error) {
	if len(bz) < headerEnd {
		return Payload{}, fmt.Errorf("bzImage: %d bytes is shorter than the boot header", len(bz))
	}
	if string(bz[offHeaderMagic:offHeaderMagic+4]) != "HdrS" {
		return Payload{}, errors.New("bzImage: no HdrS boot header magic")
	}
	if v := binary.LittleEndian.Uint16(bz[offVersion:]); v < minVersion {
		return Payload{}, fmt.Errorf("bzImage: boot protocol %#x predates payload fields (need %#x)", v, minVersion)
	}
	setupSects := int(bz[offSetupSects])
	if setupSects == 0 {
		setupSects = 4
	}
	off := uint64(setupSects+1)*512 + uint64(binary.LittleEndian.Uint32(bz[offPayloadOffset:]))
	n := uint64(binary.LittleEndian.Uint32(bz[offPayloadLength:]))
	if n < 8 || off+n > uint64(len(bz)) {
		return Payload{}, fmt.Errorf("bzImage: payload [%d, +%d) outside the %d-byte file", off, n, len(bz))
	}
	data := bz[off : off+n]
	// Every compressor's stream ends with the decompressed size as a
	// little-endian u32: gzip's own ISIZE field, and for the others
	// the kernel build appends it (scripts/Makefile.lib size_append).
	size := binary.LittleEndian.Uint32(data[len(data)-4:])
	for _, m := range magics {
		if !bytes.HasPrefix(data, m.magic) {
			continue
		}
		if m.format != "gzip" {
			data = data[:len(data)-4]
		}
		return Payload{Format: m.format, Data: data, Size: size}, nil
	}
	return Payload{}, fmt.Errorf("bzImage: unsupported payload compression (magic % x)", data[:6])
}

// ExtractVmlinux writes the uncompressed ELF kernel of the bzImage at bzPath
// to outPath.
func ExtractVmlinux(ctx context.Context, bzPath, outPath string) error {
	bz, err := os.ReadFile(bzPath)
	if err != nil {
		return fmt.Errorf("read kernel image: %w", err)
	}
	p, err := ParseBzImage(bz)
	if err != nil {
		return fmt.Errorf("%s: %w", bzPath, err)
	}
	tmp := outPath + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("create vmlinux: %w", err)
	}
	defer os.Remove(tmp)
	if err := decompress(ctx, p, f); err != nil {
		f.Close()
		return fmt.Errorf("decompress %s payload of %s: %w", p.Format, bzPath, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write vmlinux: %w", err)
	}
	if err := checkELF(tmp, p.Size); err != nil {
		return fmt.Errorf("vmlinux from %s: %w", bzPath, err)
	}
	return os.Rename(tmp, outPath)
}

func decompress(ctx context.Context, p Payload, w io.Writer) error {
	var tool []string
	switch p.Format {
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(p.Data))
		if err != nil {
			return err
		}
		zr.Multistream(false)
		_, err = io.Copy(w, zr)
		return err
	case "xz":
		tool = []string{"xz", "-dc", "--single-stream"}
	case "zstd":
		tool = []string{"zstd", "-dcq"}
	default:
		return fmt.Errorf("no decompressor for %q", p.Format)
	}
	cmd := exec.CommandContext(ctx, tool[0], tool[1:]...)
	cmd.Stdin = bytes.NewReader(p.Data)
	cmd.Stdout = w
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", tool[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// checkELF verifies that the decompressed kernel is whole: an ELF file of the
// size the bzImage announced.
func checkELF(path string, size uint32) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != int64(size) {
		return fmt.Errorf("decompressed to %d bytes, the image announces %d", st.Size(), size)
	}
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != "\x7fELF" {
		return errors.New("decompressed payload is not an ELF file")
	}
	return nil
}
