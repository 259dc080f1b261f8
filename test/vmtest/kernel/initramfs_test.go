package kernel

import (
	"slices"
	"strings"
	"testing"
)

func TestParseShowDepends(t *testing.T) {
	tests := []struct {
		name     string
		out      string
		want     []ModuleFile
		errMatch string
	}{
		{
			name: "6.1: shared dependencies once, in first-seen order",
			out: `insmod /k/fs/netfs/netfs.ko 
insmod /k/net/9p/9pnet.ko 
insmod /k/fs/9p/9p.ko 
insmod /k/drivers/virtio/virtio_ring.ko 
insmod /k/net/9p/9pnet.ko 
insmod /k/net/9p/9pnet_virtio.ko 
insmod /k/drivers/virtio/virtio_ring.ko 
insmod /k/drivers/virtio/virtio_pci.ko 
`,
			want: []ModuleFile{{Path: "/k/fs/netfs/netfs.ko"}, {Path: "/k/net/9p/9pnet.ko"}, {Path: "/k/fs/9p/9p.ko"}, {Path: "/k/drivers/virtio/virtio_ring.ko"}, {Path: "/k/net/9p/9pnet_virtio.ko"}, {Path: "/k/drivers/virtio/virtio_pci.ko"}},
		},
		{
			name: "6.12: built-in virtio_pci needs no file; options from modprobe.d kept",
			out:  "builtin virtio_pci\ninsmod /k/fs/overlayfs/overlay.ko.xz \ninsmod /k/drivers/net/dummy.ko.xz numdummies=0 debug=1\n",
			want: []ModuleFile{{Path: "/k/fs/overlayfs/overlay.ko.xz"}, {Path: "/k/drivers/net/dummy.ko.xz", Params: "numdummies=0 debug=1"}},
		},
		{
			name:     "install command from modprobe.d",
			out:      "install /bin/true\n",
			errMatch: "unexpected line",
		},
		{
			name:     "unexpected output",
			out:      "modprobe: FATAL: Module nine not found\n",
			errMatch: "unexpected line",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseShowDepends([]byte(tt.out))
			if tt.errMatch != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errMatch) {
					t.Fatalf("ParseShowDepends: %v, want an error containing %q", err, tt.errMatch)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseShowDepends: %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ParseShowDepends =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestModuleName(t *testing.T) {
	for path, want := range map[string]string{
		"/k/net/9p/9pnet_virtio.ko":              "9pnet_virtio",
		"/k/fs/overlayfs/overlay.ko.xz":          "overlay",
		"/k/arch/x86/crypto/crc32c-intel.ko.zst": "crc32c-intel",
	} {
		if got := moduleName(path); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", path, got, want)
		}
	}
}
