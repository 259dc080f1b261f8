package bpf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestSNATPortRangeStaysClearOfTheNodesPorts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		r         PortRange
		ephemeral string // the content of ip_local_port_range; "" for none
		reserved  string // of ip_local_reserved_ports; "-" for none
		force     bool
		wantErr   []string
		wantWarn  bool
		// wantReserved is ip_local_reserved_ports afterwards.
		wantReserved string
	}{
		{name: "default range, default ephemeral ports", r: DefaultSNATPortRange, ephemeral: "32768\t60999\n", reserved: "\n", wantReserved: "\n"},
		{name: "default range on a node whose ephemeral ports reach 65535: reserved", r: DefaultSNATPortRange, ephemeral: "1024 65535\n",
			reserved: "\n", wantReserved: "61000-65535"},
		{name: "reserved next to what the node reserves", r: DefaultSNATPortRange, ephemeral: "1024 65535\n",
			reserved: "8080,30000-32767\n", wantReserved: "8080,30000-32767,61000-65535"},
		{name: "reserved already", r: PortRange{61000, 62000}, ephemeral: "1024 65535\n",
			reserved: "60000-61500,61501-63000\n", wantReserved: "60000-61500,61501-63000\n"},
		{name: "cannot reserve: refused", r: DefaultSNATPortRange, ephemeral: "1024 65535\n", reserved: "-",
			wantErr: []string{"ephemeral ports 1024-65535", "ip_local_port_range", "reserving it failed"}},
		{name: "cannot reserve, forced", r: DefaultSNATPortRange, ephemeral: "1024 65535\n", reserved: "-", force: true, wantWarn: true},
		{name: "a range over the NodePorts", r: PortRange{29000, 30000}, ephemeral: "32768\t60999\n", reserved: "\n",
			wantErr: []string{"NodePort range 30000-32767"}, wantReserved: "\n"},
		{name: "below the narrowed ephemeral ports", r: PortRange{20000, 29999}, ephemeral: "40000\t60999\n", reserved: "\n", wantReserved: "\n"},
		{name: "ephemeral range unreadable: logged, only the NodePorts checked", r: DefaultSNATPortRange, reserved: "\n", wantWarn: true, wantReserved: "\n"},
		{name: "unreadable and over the NodePorts", r: PortRange{31000, 33000}, reserved: "\n", wantErr: []string{"NodePort"}, wantWarn: true, wantReserved: "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "ip_local_port_range")
			reserved := filepath.Join(dir, "ip_local_reserved_ports")
			if tc.ephemeral != "" {
				if err := os.WriteFile(path, []byte(tc.ephemeral), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.reserved != "-" {
				if err := os.WriteFile(reserved, []byte(tc.reserved), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			core, logs := observer.New(zap.WarnLevel)
			err := checkSNATPortRange(tc.r, tc.force, path, reserved, zap.New(core))
			if len(tc.wantErr) == 0 && err != nil {
				t.Fatalf("%s: %v", tc.r, err)
			}
			for _, w := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v, want an error about %q", tc.r, err, w)
				}
			}
			if got := logs.Len() > 0; got != tc.wantWarn {
				t.Errorf("%s: warned %v, want %v (%v)", tc.r, got, tc.wantWarn, logs.All())
			}
			if tc.reserved != "-" {
				b, err := os.ReadFile(reserved)
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != tc.wantReserved {
					t.Errorf("ip_local_reserved_ports %q, want %q", b, tc.wantReserved)
				}
			}
		})
	}
}
