package main

import (
	"context"
	"net/netip"

	"go.uber.org/zap"
)

// optOutApplier returns what hands the addresses of the pods opted out of
// the socket hooks to set (mode.Instance.OptedOutPods) from a goroutine of
// its own until ctx is done, the latest addresses winning, so that a
// source never waits for the scan of the node's network namespaces. One
// source calls it at a time.
func optOutApplier(ctx context.Context, set func(context.Context, []netip.Addr) error, log *zap.Logger) func([]netip.Addr) {
	latest := make(chan []netip.Addr, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case addrs := <-latest:
				log.Debug("pods opted out of the socket hooks", zap.Stringers("addresses", addrs))
				if err := set(ctx, addrs); err != nil {
					log.Warn("pods opted out of the socket hooks: not every one is translated per packet yet; retried on the node's link events and every 10s", zap.Error(err))
				}
			}
		}
	}()
	return func(addrs []netip.Addr) {
		select {
		case <-latest:
		default:
		}
		latest <- addrs
	}
}
