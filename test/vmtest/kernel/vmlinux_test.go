package kernel

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// bzImage builds a minimal bzImage: a boot header that places payload right
// after the setup sectors, as the kernel build does.
func bzImage(setupSects byte, version uint16, payload []byte) []byte {
	sects := int(setupSects)
	if sects == 0 {
		sects = 4
	}
	img := make([]byte, (sects+1)*512)
	img[offSetupSects] = setupSects
	copy(img[offHeaderMagic:], "HdrS")
	binary.LittleEndian.PutUint16(img[offVersion:], version)
	binary.LittleEndian.PutUint32(img[offPayloadOffset:], 0)
	binary.LittleEndian.PutUint32(img[offPayloadLength:], uint32(len(payload)))
	return append(img, payload...)
}

// withSize appends the decompressed size as the kernel build does.
func withSize(stream []byte, size uint32) []byte {
	return binary.LittleEndian.AppendUint32(append([]byte(nil), stream...), size)
}

func gzipped(t *testing.T, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestParseBzImage(t *testing.T) {
	xzStream := []byte{0xfd, '7', 'z', 'X', 'Z', 0x00, 1, 2, 3, 4}
	zstdStream := []byte{0x28, 0xb5, 0x2f, 0xfd, 9, 9, 9, 9}
	gz := gzipped(t, []byte("\x7fELF-kernel"))
	tests := []struct {
		name     string
		image    []byte
		format   string
		data     []byte
		size     uint32
		errMatch string
	}{
		{
			name:   "xz payload (6.1): size trailer stripped",
			image:  bzImage(39, 0x020f, withSize(xzStream, 65906612)),
			format: "xz", data: xzStream, size: 65906612,
		},
		{
			name:   "zstd payload (6.12): size trailer stripped",
			image:  bzImage(39, 0x020f, withSize(zstdStream, 57647116)),
			format: "zstd", data: zstdStream, size: 57647116,
		},
		{
			name:   "gzip payload: its own ISIZE trailer stays part of the stream",
			image:  bzImage(30, 0x020f, gz),
			format: "gzip", data: gz, size: uint32(len("\x7fELF-kernel")),
		},
		{
			name:   "setup_sects 0 means 4",
			image:  bzImage(0, 0x0208, withSize(xzStream, 1)),
			format: "xz", data: xzStream, size: 1,
		},
		{
			name:     "not a bzImage",
			image:    make([]byte, 4096),
			errMatch: "HdrS",
		},
		{
			name:     "boot protocol without payload fields",
			image:    bzImage(4, 0x0207, withSize(xzStream, 1)),
			errMatch: "predates",
		},
		{
			name:     "truncated file",
			image:    bzImage(4, 0x020f, withSize(xzStream, 1))[:2565],
			errMatch: "outside",
		},
		{
			name:     "shorter than the header",
			image:    []byte("MZ"),
			errMatch: "shorter",
		},
		{
			name:     "unknown compressor",
			image:    bzImage(4, 0x020f, withSize([]byte("LZ4!....."), 1)),
			errMatch: "unsupported",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParseBzImage(tt.image)
			if tt.errMatch != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errMatch) {
					t.Fatalf("ParseBzImage: %v, want an error containing %q", err, tt.errMatch)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseBzImage: %v", err)
			}
			if p.Format != tt.format || !bytes.Equal(p.Data, tt.data) || p.Size != tt.size {
				t.Errorf("ParseBzImage = {%s % x %d}, want {%s % x %d}", p.Format, p.Data, p.Size, tt.format, tt.data, tt.size)
			}
		})
	}
}

func TestExtractVmlinux(t *testing.T) {
	elfImage := append([]byte("\x7fELF"), bytes.Repeat([]byte{0xcc}, 10000)...)
	tests := []struct {
		name     string
		payload  []byte
		errMatch string
	}{
		{"gzip payload decompresses to the ELF kernel", gzipped(t, elfImage), ""},
		{"payload that is not an ELF file is rejected", gzipped(t, bytes.Repeat([]byte{1}, 100)), "not an ELF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			bz := filepath.Join(dir, "vmlinuz")
			if err := os.WriteFile(bz, bzImage(30, 0x020f, tt.payload), 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "vmlinux")
			err := ExtractVmlinux(context.Background(), bz, out)
			if tt.errMatch != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errMatch) {
					t.Fatalf("ExtractVmlinux: %v, want an error containing %q", err, tt.errMatch)
				}
				if _, err := os.Stat(out); err == nil {
					t.Errorf("%s exists after a failed extraction", out)
				}
				return
			}
			if err != nil {
				t.Fatalf("ExtractVmlinux: %v", err)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, elfImage) {
				t.Errorf("vmlinux differs from the compressed image (%d bytes, want %d)", len(got), len(elfImage))
			}
		})
	}
}
