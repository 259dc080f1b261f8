package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestSNATPortRangeFlag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    portRange
		wantErr string
	}{
		{"default: above the ephemeral and NodePort ranges", nil, portRange{61000, 65535}, ""},
		{"a wider range", []string{"--nodeport-snat-port-range=50000-65535"}, portRange{50000, 65535}, ""},
		{"a single port", []string{"--nodeport-snat-port-range=61000-61000"}, portRange{61000, 61000}, ""},
		{"no dash", []string{"--nodeport-snat-port-range=61000"}, portRange{}, "want min-max"},
		{"not a number", []string{"--nodeport-snat-port-range=61000-lots"}, portRange{}, "is not a port"},
		{"beyond 65535", []string{"--nodeport-snat-port-range=61000-70000"}, portRange{}, "is not a port"},
		{"reversed", []string{"--nodeport-snat-port-range=65000-61000"}, portRange{}, "min <= max"},
		{"well-known ports", []string{"--nodeport-snat-port-range=80-2000"}, portRange{}, "1024 <= min"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parse(t, tc.args...)
			err := o.validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--nodeport-snat-port-range") {
					t.Fatalf("%v: %v, want an error naming the flag and %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.snatPorts != tc.want {
				t.Errorf("%v: range %s, want %s", tc.args, o.snatPorts, tc.want)
			}
		})
	}
}

func TestSNATPortRangeStaysClearOfTheNodesPorts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		r         portRange
		ephemeral string // the content of ip_local_port_range; "" for none
		reserved  string // of ip_local_reserved_ports; "-" for none
		force     bool
		wantErr   []string
		wantWarn  bool
		// wantReserved is ip_local_reserved_ports afterwards.
		wantReserved string
	}{
		{name: "default range, default ephemeral ports", r: defaultSNATPortRange, ephemeral: "32768\t60999\n", reserved: "\n", wantReserved: "\n"},
		{name: "default range on a node whose ephemeral ports reach 65535: reserved", r: defaultSNATPortRange, ephemeral: "1024 65535\n",
			reserved: "\n", wantReserved: "61000-65535"},
		{name: "reserved next to what the node reserves", r: defaultSNATPortRange, ephemeral: "1024 65535\n",
			reserved: "8080,30000-32767\n", wantReserved: "8080,30000-32767,61000-65535"},
		{name: "reserved already", r: portRange{61000, 62000}, ephemeral: "1024 65535\n",
			reserved: "60000-61500,61501-63000\n", wantReserved: "60000-61500,61501-63000\n"},
		{name: "cannot reserve: refused", r: defaultSNATPortRange, ephemeral: "1024 65535\n", reserved: "-",
			wantErr: []string{"ephemeral ports 1024-65535", "ip_local_port_range", "reserving it failed"}},
		{name: "cannot reserve, forced", r: defaultSNATPortRange, ephemeral: "1024 65535\n", reserved: "-", force: true, wantWarn: true},
		{name: "a range over the NodePorts", r: portRange{29000, 30000}, ephemeral: "32768\t60999\n", reserved: "\n",
			wantErr: []string{"NodePort range 30000-32767"}, wantReserved: "\n"},
		{name: "below the narrowed ephemeral ports", r: portRange{20000, 29999}, ephemeral: "40000\t60999\n", reserved: "\n", wantReserved: "\n"},
		{name: "ephemeral range unreadable: logged, only the NodePorts checked", r: defaultSNATPortRange, reserved: "\n", wantWarn: true, wantReserved: "\n"},
		{name: "unreadable and over the NodePorts", r: portRange{31000, 33000}, reserved: "\n", wantErr: []string{"NodePort"}, wantWarn: true, wantReserved: "\n"},
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
