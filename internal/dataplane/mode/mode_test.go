package mode

import (
	"errors"
	"slices"
	"testing"

	"github.com/ebpf-proxy/ebpf-proxy/internal/metrics"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// familyDataplane is a dataplane that only knows its family: PerFamily
// never syncs, it only starts and collects.
type familyDataplane struct{ family string }

func (d *familyDataplane) Name() string            { return "test-" + d.family }
func (d *familyDataplane) Sync(model.Update) error { return nil }

// The fallback modes (iptables and ipvs) start one dataplane per family,
// primary first: a primary that fails is the mode's error, a secondary
// that fails is left out with its reason.
func TestPerFamilyStartsEachFamilyPrimaryFirst(t *testing.T) {
	errNo6 := errors.New("no ip6tables here")
	errNo4 := errors.New("no IPVS here")
	for _, tc := range []struct {
		name     string
		families []string
		fail     map[string]error
		served   []string
		skipped  map[string]error
		err      error
	}{
		{"dual-stack, IPv4 primary", []string{metrics.IPv4, metrics.IPv6}, nil, []string{metrics.IPv4, metrics.IPv6}, nil, nil},
		{"dual-stack, IPv6 primary", []string{metrics.IPv6, metrics.IPv4}, nil, []string{metrics.IPv6, metrics.IPv4}, nil, nil},
		{"IPv6 alone", []string{metrics.IPv6}, nil, []string{metrics.IPv6}, nil, nil},
		{"secondary fails", []string{metrics.IPv4, metrics.IPv6}, map[string]error{metrics.IPv6: errNo6},
			[]string{metrics.IPv4}, map[string]error{metrics.IPv6: errNo6}, nil},
		{"primary fails", []string{metrics.IPv4, metrics.IPv6}, map[string]error{metrics.IPv4: errNo4}, nil, nil, errNo4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tried []string
			ds, in, err := PerFamily(tc.families, func(f string) (*familyDataplane, error) {
				tried = append(tried, f)
				if err := tc.fail[f]; err != nil {
					return nil, err
				}
				return &familyDataplane{family: f}, nil
			})
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if err != nil {
				if len(tried) != 1 || ds != nil || in != nil {
					t.Errorf("after the primary failed: tried %v, started %v %v; want nothing more", tried, ds, in)
				}
				return
			}
			served, skipped := in.Families, in.Skipped
			var got []string
			for i, f := range served {
				got = append(got, f.IPFamily)
				if f.Dataplane != ds[i] || ds[i].family != f.IPFamily {
					t.Errorf("family %s is served by %s's dataplane", f.IPFamily, ds[i].family)
				}
			}
			if !slices.Equal(got, tc.served) {
				t.Errorf("served %v, want %v", got, tc.served)
			}
			if len(skipped) != len(tc.skipped) {
				t.Errorf("skipped %v, want %v", skipped, tc.skipped)
			}
			for f, why := range tc.skipped {
				if !errors.Is(skipped[f], why) {
					t.Errorf("skipped[%s] = %v, want %v", f, skipped[f], why)
				}
			}
		})
	}
}
