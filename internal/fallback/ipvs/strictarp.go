package ipvs

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/ebpf-proxy/ebpf-proxy/internal/sysctl"
)

// ApplyStrictARP makes the node answer ARP only for addresses of the
// device asked (arp_ignore=1) and announce its best local address
// (arp_announce=2), so that the Service addresses ipvs mode binds to its
// dummy device do not attract traffic meant for a load balancer's
// speaker (MetalLB in L2 mode needs it), as kube-proxy's --ipvs-strict-arp.
func ApplyStrictARP(sys sysctl.Sysctl, log *zap.Logger) error {
	for _, s := range []struct {
		name  string
		value int
	}{{"net/ipv4/conf/all/arp_ignore", 1}, {"net/ipv4/conf/all/arp_announce", 2}} {
		wrote, err := sys.SetInt(s.name, s.value)
		if err != nil {
			return fmt.Errorf("--ipvs-strict-arp: %w", err)
		}
		if wrote {
			log.Info("set an ARP parameter for --ipvs-strict-arp", zap.String("sysctl", s.name), zap.Int("value", s.value))
		}
	}
	return nil
}
