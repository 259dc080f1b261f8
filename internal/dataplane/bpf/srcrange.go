package bpf

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// sourceRangeCheck attaches the egress program that holds pods and the node
// to loadBalancerSourceRanges only while some Service has them: it runs for
// every packet the node's sockets send, so a cluster without source ranges
// does not pay for it.
type sourceRangeCheck struct {
	set func(on bool) error
	on  func() bool
	log *zap.Logger
}

// before attaches the check ahead of a sync that writes source ranges, so
// that no socket is translated to such a LoadBalancer IP unchecked. A
// failure fails the sync: the ranged Service is then not programmed at all
// rather than open to every pod.
func (c *sourceRangeCheck) before(up model.Update) error {
	if c == nil || c.on() || !maps.WantsSourceRangeCheck(up) {
		return nil
	}
	if err := c.set(true); err != nil {
		return fmt.Errorf("attach the loadBalancerSourceRanges check for the node's sockets: %w", err)
	}
	c.log.Info("loadBalancerSourceRanges check for pods and the node attached")
	return nil
}

// after detaches the check once a sync left no source ranges in the maps
// of any of the writers (one per family).
func (c *sourceRangeCheck) after(ws ...*maps.Writer) {
	if c == nil || !c.on() || slices.ContainsFunc(ws, (*maps.Writer).HasSourceRanges) {
		return
	}
	if err := c.set(false); err != nil {
		c.log.Warn("detaching the loadBalancerSourceRanges check", zap.Error(err))
		return
	}
	c.log.Info("loadBalancerSourceRanges check for pods and the node detached: no Service has source ranges")
}
