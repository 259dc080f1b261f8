package kernel

import (
	"strings"
	"testing"
)

// aptList is a trimmed apt-cache search listing as bookworm shows it, in
// apt's own (unsorted) order.
const aptList = `linux-image-6.1.0-9-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-56-cloud-amd64 - Linux 6.1 for x86-64 cloud (signed)
linux-image-6.1.0-56-amd64-dbg - Debug symbols for linux-image-6.1.0-56-amd64
linux-image-6.1.0-56-amd64-unsigned - Linux 6.1 for 64-bit PCs
linux-image-6.1.0-56-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-56-rt-amd64 - Linux 6.1 for 64-bit PCs, PREEMPT_RT (signed)
linux-image-6.1.0-10-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-57-cloud-amd64 - Linux 6.1 for x86-64 cloud (signed)
linux-image-6.12-amd64 - Linux for 64-bit PCs (meta-package)
linux-image-6.12-amd64-signed-template - Template for signed linux-image packages for amd64
linux-image-6.12.9+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-amd64-dbg - Debug symbols for linux-image-6.12.117+deb12-amd64
linux-image-6.12.117+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud (signed)
linux-image-6.12.115+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.120+deb12-amd64-unsigned - Linux 6.12 for 64-bit PCs
linux-image-amd64 - Linux for 64-bit PCs (meta-package)
`

func TestNewest(t *testing.T) {
	names := ParseSearch([]byte(aptList))
	tests := []struct {
		name   string
		series string
		names  []string
		want   []string // packages, best first
	}{
		{
			name:   "6.1: newest ABI first, numerically, signed before unsigned; cloud, rt and dbg ignored",
			series: "6.1",
			names:  names,
			want: []string{
				"linux-image-6.1.0-56-amd64",
				"linux-image-6.1.0-56-amd64-unsigned",
				"linux-image-6.1.0-10-amd64",
				"linux-image-6.1.0-9-amd64",
			},
		},
		{
			name:   "6.12: a newer release only unsigned wins over older signed ones; metapackages ignored",
			series: "6.12",
			names:  names,
			want: []string{
				"linux-image-6.12.120+deb12-amd64-unsigned",
				"linux-image-6.12.117+deb12-amd64",
				"linux-image-6.12.115+deb12-amd64",
				"linux-image-6.12.9+deb12-amd64",
			},
		},
		{
			name:   "6.1 does not match 6.12 packages",
			series: "6.1",
			names:  []string{"linux-image-6.12.117+deb12-amd64", "linux-image-6.1.0-3-amd64"},
			want:   []string{"linux-image-6.1.0-3-amd64"},
		},
		{
			name:   "duplicates and surrounding space are tolerated",
			series: "6.12",
			names:  []string{" linux-image-6.12.1+deb12-amd64", "linux-image-6.12.1+deb12-amd64 "},
			want:   []string{"linux-image-6.12.1+deb12-amd64"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Newest(tt.series, tt.names)
			if err != nil {
				t.Fatalf("Newest(%s): %v", tt.series, err)
			}
			var pkgs []string
			for _, c := range got {
				pkgs = append(pkgs, c.Package)
			}
			if strings.Join(pkgs, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("Newest(%s) =\n%s\nwant\n%s", tt.series, strings.Join(pkgs, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}

func TestNewestWithoutCandidates(t *testing.T) {
	tests := []struct {
		name   string
		series string
		names  []string
	}{
		{"empty list (apt lists never downloaded)", "6.1", nil},
		{"only other flavours", "6.1", []string{"linux-image-6.1.0-56-cloud-amd64", "linux-image-6.1.0-56-amd64-dbg"}},
		{"series not offered", "5.10", ParseSearch([]byte(aptList))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := Newest(tt.series, tt.names); err == nil {
				t.Errorf("Newest(%s) = %v, want an error", tt.series, got)
			}
		})
	}
}

func TestParseCandidate(t *testing.T) {
	tests := []struct {
		name    string
		pkg     string
		ok      bool
		release string
		series  string
	}{
		{"signed 6.1", "linux-image-6.1.0-56-amd64", true, "6.1.0-56-amd64", "6.1"},
		{"unsigned 6.1 installs the same release", "linux-image-6.1.0-56-amd64-unsigned", true, "6.1.0-56-amd64", "6.1"},
		{"6.12 from bookworm-security", "linux-image-6.12.117+deb12-amd64", true, "6.12.117+deb12-amd64", "6.12"},
		{"cloud flavour has no 9p", "linux-image-6.1.0-56-cloud-amd64", false, "", ""},
		{"debug symbols", "linux-image-6.12.117+deb12-amd64-dbg", false, "", ""},
		{"metapackage", "linux-image-6.12-amd64", false, "", ""},
		{"other architecture", "linux-image-6.1.0-56-arm64", false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, ok := ParseCandidate(tt.pkg)
			if ok != tt.ok || c.Release != tt.release || c.Series != tt.series {
				t.Errorf("ParseCandidate(%q) = %+v, %v; want release %q series %q, %v", tt.pkg, c, ok, tt.release, tt.series, tt.ok)
			}
		})
	}
}

func TestParseSearch(t *testing.T) {
	got := ParseSearch([]byte("a - first\n\nb - second - with dash\n"))
	if strings.Join(got, ",") != "a,b" {
		t.Errorf("ParseSearch = %q, want [a b]", got)
	}
}
