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
		force     bool
		wantErr   []string
		wantWarn  bool
	}{
		{"default range, default ephemeral ports", defaultSNATPortRange, "32768\t60999\n", false, nil, false},
		{"default range on a node whose ephemeral ports reach 65535", defaultSNATPortRange, "1024 65535\n", false, []string{"ephemeral ports 1024-65535", "ip_local_port_range"}, false},
		{"the same, forced", defaultSNATPortRange, "1024 65535\n", true, nil, true},
		{"a range inside the ephemeral ports", portRange{40000, 45000}, "32768\t60999\n", false, []string{"ephemeral ports 32768-60999"}, false},
		{"a range over the NodePorts", portRange{29000, 30000}, "32768\t60999\n", false, []string{"NodePort range 30000-32767"}, false},
		{"both", portRange{30000, 40000}, "32768\t60999\n", false, []string{"ephemeral", "NodePort"}, false},
		{"below the narrowed ephemeral ports", portRange{20000, 29999}, "40000\t60999\n", false, nil, false},
		{"ephemeral range unreadable: logged, only the NodePorts checked", defaultSNATPortRange, "", false, nil, true},
		{"unreadable and over the NodePorts", portRange{31000, 33000}, "", false, []string{"NodePort"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ip_local_port_range")
			if tc.ephemeral != "" {
				if err := os.WriteFile(path, []byte(tc.ephemeral), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			core, logs := observer.New(zap.WarnLevel)
			err := checkSNATPortRange(tc.r, tc.force, path, zap.New(core))
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
		})
	}
}
