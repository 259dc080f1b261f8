package proxymode_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ebpf-proxy/ebpf-proxy/internal/config"
	"github.com/ebpf-proxy/ebpf-proxy/internal/dataplane/mode"
	"github.com/ebpf-proxy/ebpf-proxy/internal/proxymode"
)

// TestHandoverRemovesTheOtherModesAtTheFirstWrite checks the order a
// takeover keeps: what of the other modes must go at the first write of a
// family is listed before the new mode starts, and removed when that mode
// says the family is written, for that family alone; the running mode's
// own handover is never asked, and one that cannot list is logged and
// does not stop the start.
func TestHandoverRemovesTheOtherModesAtTheFirstWrite(t *testing.T) {
	var events []string
	handover := func(name string, listErr error) func(context.Context) (func(string) (int, error), error) {
		return func(context.Context) (func(string) (int, error), error) {
			events = append(events, "list "+name)
			if listErr != nil {
				return nil, listErr
			}
			return func(family string) (int, error) {
				events = append(events, "remove "+name+" "+family)
				return 2, nil
			}, nil
		}
	}
	periods := func(*config.Options) (time.Duration, time.Duration) { return time.Second, 0 }
	ms := proxymode.Modes{
		{Name: "old", Handover: handover("old", nil), SyncPeriods: periods},
		{Name: "broken", Handover: handover("broken", errors.New("no netlink")), SyncPeriods: periods},
		{Name: "new", Handover: handover("new", nil), SyncPeriods: periods,
			Start: func(_ context.Context, env mode.Env) (*mode.Instance, error) {
				events = append(events, "start new")
				env.Written("IPv6")
				return &mode.Instance{}, nil
			}},
	}
	core, logs := observer.New(zap.InfoLevel)
	s, err := ms.Start(context.Background(), &config.Options{ProxyMode: "new"}, proxymode.Config{Families: []string{"IPv4", "IPv6"}}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := []string{"list old", "list broken", "start new", "remove old IPv6"}
	if !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	if n := logs.FilterMessageSnippet("cannot list what of another mode").FilterField(zap.String("mode", "broken")).Len(); n != 1 {
		t.Errorf("%d log lines say the broken mode's handover could not be listed, want 1", n)
	}
	removed := logs.FilterMessageSnippet("removed at the first sync").FilterField(zap.String("ipFamily", "IPv6")).FilterField(zap.Int("removed", 2))
	if removed.Len() != 1 {
		t.Errorf("%d log lines say what was removed at the first write of IPv6, want 1: %v", removed.Len(), logs.All())
	}
}
