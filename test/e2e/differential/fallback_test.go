package differential

import (
	"fmt"
	"strings"

	"github.com/ebpf-proxy/ebpf-proxy/test/e2e/testbed"
)

// fallback is one of ebpf-proxy's fallback modes in the differential run:
// the agent started with --proxy-mode=<mode>, compared with upstream
// kube-proxy as the BPF mode is, and summed up in a line of its own before
// the final (BPF mode) line. The IPVS fallback cannot join: the host's
// kernel has no ip_vs, and the end-to-end suite does not run in the VMs.
type fallback struct {
	kind testbed.Kind
	mode string
	// upstream is kube-proxy's mode of the same name, whose verdict the
	// fallback must give where upstream's iptables and nftables modes
	// disagree (where they agree, it is the verdict of both).
	upstream testbed.Kind
	// knownDiff, when set, is a difference from upstream's mode that the
	// fallback is known to have, and says what it is: a probe that
	// upstream's nftables mode refuses and its iptables mode leaves
	// unanswered (UNREACHABLE), which the fallback leaves unanswered as
	// upstream's iptables mode, counts as known, not as a mismatch.
	knownDiff string
	// features are what the mode implements; a scenario that needs
	// another is not run against it and counts as unsupported.
	features map[Feature]bool
}

// netfilterFeatures are what the netfilter fallbacks implement: rendered
// as upstream's rules, so traffic from the network and source ranges work
// too; the health check node port server serves every mode; IPv6 is
// rendered from the same model.
var netfilterFeatures = map[Feature]bool{
	FeatureNodePort:        true,
	FeatureHealthCheck:     true,
	FeatureExternalIP:      true,
	FeatureLoadBalancer:    true,
	FeatureAffinity:        true,
	FeatureExternalTraffic: true,
	FeatureSourceRanges:    true,
	FeatureIPv6:            true,
	FeatureIPv6External:    true,
	FeatureMesh:            true,
}

// fallbacks are the fallback modes every scenario runs against.
var fallbacks = []fallback{
	{kind: testbed.EbpfProxyIPTables, mode: "iptables", upstream: testbed.KubeProxyIPTables, features: netfilterFeatures},
	{kind: testbed.EbpfProxyNFTables, mode: "nftables", upstream: testbed.KubeProxyNFTables, features: netfilterFeatures,
		knownDiff: "traffic to an address of the service CIDR that no Service has, or to a port a ClusterIP does not serve, is left to the routes (kube-proxy's iptables mode's UNREACHABLE) where kube-proxy's nftables mode drops or rejects it: the fallback watches no ServiceCIDRs"},
}

// agentFeatures are the features ebpf-proxy implements in the mode of kind.
func agentFeatures(kind testbed.Kind) map[Feature]bool {
	for _, f := range fallbacks {
		if f.kind == kind {
			return f.features
		}
	}
	if kind == testbed.EbpfProxyPods {
		return ebpfPodsFeatures
	}
	return ebpfProxyFeatures
}

// fallbackTally counts one fallback mode's verdicts over the scenarios.
type fallbackTally struct {
	fallback
	ran                                    bool
	n, match, mismatch, known, unsupported int
	// knownIn are the scenarios with a known difference.
	knownIn []string
}

func newFallbackTallies(runs map[testbed.Kind]verdicts) []*fallbackTally {
	var out []*fallbackTally
	for _, f := range fallbacks {
		out = append(out, &fallbackTally{fallback: f, ran: runs[f.kind] != nil})
	}
	return out
}

// judge compares the fallback's verdicts in scenario si with those of
// upstream's mode of the same name (both of upstream's modes are shown),
// counts the outcome and returns the mismatching probes as text ("" if
// none).
func (f *fallbackTally) judge(si int, sc Scenario, runs map[testbed.Kind]verdicts) string {
	if !f.ran {
		return ""
	}
	f.n++
	if lacking := missing(sc.Needs, f.features); len(lacking) > 0 {
		f.unsupported++
		return ""
	}
	ipt, nft, got := runs[testbed.KubeProxyIPTables].of(si), runs[testbed.KubeProxyNFTables].of(si), runs[f.kind].of(si)
	var b, k strings.Builder
	for st, step := range sc.Steps {
		for pi, p := range step.Probes {
			up, nf, v := at(ipt, st, pi), at(nft, st, pi), at(got, st, pi)
			want := up
			if f.upstream == testbed.KubeProxyNFTables {
				want = nf
			}
			switch {
			case v == want:
			case f.knownDiff != "" && v == up && up == "UNREACHABLE" && refusal(nf):
				fmt.Fprintf(&k, "  step %d: %s\n    %s\n      iptables: %s\n      nftables: %s\n      %s fallback: %s   (known difference)\n",
					st+1, step.Name, p, up, nf, f.mode, v)
			default:
				fmt.Fprintf(&b, "  step %d: %s\n    %s\n      iptables: %s\n      nftables: %s\n      %s fallback: %s   <-- MISMATCH\n",
					st+1, step.Name, p, up, nf, f.mode, v)
			}
		}
	}
	switch {
	case b.Len() > 0:
		f.mismatch++
		return fmt.Sprintf("scenario %q: %s fallback mismatch\n%s%s", sc.Name, f.mode, b.String(), k.String())
	case k.Len() > 0:
		f.known++
		f.knownIn = append(f.knownIn, sc.Name)
		return ""
	}
	f.match++
	return ""
}

// refusal says whether a verdict is upstream's refusal of a packet: a
// drop, a reject, or the EPERM a local sender gets from either.
func refusal(v string) bool {
	return v == "DROP" || v == "REJECT" || v == "ERROR EPERM"
}

// summary is the fallback's line, in the form of the final one, with the
// scenarios of known differences counted apart.
func (f *fallbackTally) summary() string {
	if !f.ran {
		return fmt.Sprintf("differential (%s fallback): not run", f.mode)
	}
	return fmt.Sprintf("differential (%s fallback): scenarios=%d match=%d mismatch=%d known=%d unsupported=%d", f.mode, f.n, f.match, f.mismatch, f.known, f.unsupported)
}

// knownLine says which scenarios hold the fallback's known difference,
// and what it is; "" if none.
func (f *fallbackTally) knownLine() string {
	if len(f.knownIn) == 0 {
		return ""
	}
	return fmt.Sprintf("%s fallback, known difference in %d scenario(s): %s: %s", f.mode, len(f.knownIn), f.knownDiff, strings.Join(f.knownIn, "; "))
}
