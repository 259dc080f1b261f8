package trace

import (
	"fmt"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// externalFrontend are the kinds the TC programs serve (EXTERNAL_FRONTEND).
const externalFrontend = maps.FlagNodePort | maps.FlagExternalIP | maps.FlagLoadBalancer

// external follows tc_ingress (bpf/tc.c) and the decisions of
// bpf/lib/nodeport.h, which XDP shares: the first packet of a connection
// from an outside client arriving on a device.
func (t *tracer) external() error {
	in, m := t.in, t.env.Maps
	t.step("hook", "TC ingress of %s (and XDP there, which makes the same decisions)", orUnknown(in.Client.Device))
	if in.Proto != model.TCP && in.Proto != model.UDP {
		t.step("protocol", "%s: the TC programs translate TCP and UDP only", in.Proto)
		t.verdict(VerdictUntouched, RuleNoFrontend, "the packet passes to the kernel untranslated")
		return nil
	}
	if in.Client.Ifindex != 0 {
		if a, ok, err := m.SNATAddr(uint32(in.Client.Ifindex)); err != nil {
			return err
		} else if ok {
			t.step("source NAT addresses map: "+in.Client.Device, "%s: a device the agent attached to", a)
		} else if m.HasSNATAddrs() {
			t.step("source NAT addresses map: "+in.Client.Device, "no entry: the agent may not have attached to %s (--devices)", in.Client.Device)
		}
	}
	if !m.HasConntrack() {
		t.step("connection tracking map", "not pinned: the TC programs never ran on this node")
	}

	// A tracked flow first (np_lookup_tracked), with a known tuple.
	var flow *maps.CTEntry
	client := netip.AddrPortFrom(in.Client.Addr, in.Client.Port)
	if m.HasConntrack() {
		if in.Client.Port != 0 {
			e, ok, err := m.Conntrack(client, in.Dest, in.Proto, false)
			if err != nil {
				return err
			}
			check := fmt.Sprintf("conntrack map: %s -> %s/%s, original direction", client, in.Dest, in.Proto)
			if !ok {
				t.step(check, "no entry: a new flow")
			} else {
				f, err := t.flow(e)
				if err != nil {
					return err
				}
				t.r.Flows = append(t.r.Flows, f)
				if f.Holds {
					t.step(check, "backend %s, expires in %ds: the flow holds, its packets follow it", f.Backend, f.ExpiresInSeconds)
					flow = &e
				} else {
					t.step(check, "backend %s: no longer holds (expired, its backend removed, or its source NAT port taken): a new choice", f.Backend)
				}
			}
		} else if t.env.Flows != nil {
			es, err := t.env.Flows(in.Client.Addr, in.Dest, in.Proto)
			if err != nil {
				return err
			}
			for _, e := range es {
				f, err := t.flow(e)
				if err != nil {
					return err
				}
				t.r.Flows = append(t.r.Flows, f)
			}
			t.step("conntrack map: flows of "+in.Client.Addr.String()+" to "+in.Dest.String(),
				"%d (a new connection comes from a new source port: give --source-port to follow one)", len(es))
		}
	}

	fe, svc, ok, err := m.LookupService(in.Dest.Addr(), in.Dest.Port(), in.Proto, maps.ScopeExternal)
	if err != nil {
		return err
	}
	check := fmt.Sprintf("services map: %s, slot 0, external scope", in.Dest)
	if ok {
		t.frontend(fe, svc)
		t.step(check, "%s", t.describeMaster(fe, svc))
	} else {
		t.step(check, "no entry: not a Service frontend")
	}
	// A flow that holds is translated before, and whatever, the services
	// map says (tc_ingress).
	if flow != nil {
		return t.existingFlow(fe, svc, ok, *flow)
	}
	if !ok {
		t.verdict(VerdictUntouched, RuleNoFrontend, "the packet passes to the kernel untranslated")
		return nil
	}
	if svc.Flags&externalFrontend == 0 {
		t.step("kind", "not a NodePort, ExternalIP or LoadBalancer IP: ClusterIPs are not translated for clients outside the node")
		t.verdict(VerdictUntouched, RuleNotExternal, "the packet passes to the kernel untranslated")
		return nil
	}
	if svc.Flags&maps.FlagDrop != 0 {
		t.step("verdict", "drop flag: externalTrafficPolicy Local with no endpoint on this node")
		t.verdict(VerdictDrop, RuleTrafficPolicyLocal, "the packet is dropped: the client gets no answer and times out")
		return nil
	}
	if svc.Flags&maps.FlagReject != 0 || svc.Count == 0 {
		t.step("verdict", "reject: no usable endpoint (before the source ranges, as kube-proxy)")
		t.verdict(VerdictReject, RuleNoEndpoints, "answered with an ICMP port unreachable: connect() fails with ECONNREFUSED")
		return nil
	}
	if svc.Flags&maps.FlagSourceRanges != 0 {
		ok, err := m.SourceRangeAdmits(svc.SvcId, in.Client.Addr)
		if err != nil {
			return err
		}
		check := fmt.Sprintf("source ranges map: ServicePort %d, %s", svc.SvcId, in.Client.Addr)
		if !ok {
			t.step(check, "outside every range")
			t.verdict(VerdictDrop, RuleSourceRange, "the packet is dropped: the client gets no answer and times out")
			return nil
		}
		t.step(check, "within the ranges: admitted")
	}
	if err := t.candidates(fe, svc); err != nil {
		return err
	}
	extLocal := svc.Flags&maps.FlagExternalLocal != 0
	for i := range t.r.Candidates {
		b := &t.r.Candidates[i]
		if b.Missing {
			continue
		}
		if a, _, err := t.snatFor(*b, extLocal); err != nil {
			return err
		} else {
			b.SNAT = a
		}
	}
	chosen, err := t.externalChoice(svc)
	if err != nil {
		return err
	}
	if chosen == nil {
		chosen = t.onlyCandidate()
	}
	if chosen == nil {
		t.snatRule(extLocal)
		t.verdict(VerdictForward, RuleEndpoints, fmt.Sprintf("translated to one of %d backends", len(t.r.Candidates)))
		return nil
	}
	a, dev, err := t.snatFor(*chosen, extLocal)
	if err != nil {
		return err
	}
	switch {
	case a.IsValid():
		t.r.SNAT = &SNAT{Address: a, Device: dev}
		t.step("source NAT", "%s: to %s (device %s) and a free port of the source NAT range; replies return here", t.whyNAT(*chosen, extLocal), a, orUnknown(dev))
	case !chosen.Local:
		t.step("source NAT", "backend on another node, but no source NAT address for the device toward it or %s", in.Client.Device)
		t.verdict(VerdictDrop, RuleNoSNATAddress, "the packet is dropped (tc_snat_no_address)")
		return nil
	default:
		t.step("source NAT", "none: %s; the backend sees the client's address", t.whyNAT(*chosen, extLocal))
	}
	t.verdict(VerdictForward, RuleEndpoints, fmt.Sprintf("translated to %s", chosen.AddrPort()))
	return nil
}

// externalChoice follows lb_choose_backend as np_decide calls it: the
// client's affinity entry by address, else the Maglev table's backend for
// the flow's hash (when a member), else a random slot.
func (t *tracer) externalChoice(svc maps.ServiceValue) (*Backend, error) {
	in, m := t.in, t.env.Maps
	if svc.AffinityTimeout != 0 {
		e, found, err := m.AffinityOfAddr(in.Client.Addr, svc.SvcId)
		if err != nil {
			return nil, err
		}
		b, err := t.affinity(svc, e, found, in.Client.Addr.String())
		if err != nil || b != nil {
			return b, err
		}
	}
	note := ""
	if svc.AffinityTimeout != 0 {
		note = "; remembered for the client's address"
	}
	var sel *Selection
	switch {
	case svc.Flags&maps.FlagMaglev == 0:
		// The program looks for no table (no SVC_F_MAGLEV).
	case in.Client.Port == 0:
		_, _, size, ok, err := m.MaglevBackend(svc.SvcId, 0)
		if err != nil {
			return nil, err
		}
		if ok {
			t.step(fmt.Sprintf("Maglev table: ServicePort %d", svc.SvcId), "%d slots: the backend depends on the flow's hash, of its source port: give --source-port", size)
			sel = &Selection{Method: MethodMaglev, MaglevTableSize: size, Note: "by the hash of the flow's addresses, ports and protocol" + note}
		}
	default:
		hash := m.FlowHash(netip.AddrPortFrom(in.Client.Addr, in.Client.Port), in.Dest, in.Proto)
		id, idx, size, ok, err := m.MaglevBackend(svc.SvcId, hash)
		if err != nil {
			return nil, err
		}
		check := fmt.Sprintf("Maglev table: ServicePort %d", svc.SvcId)
		if ok {
			member, err := m.Member(id, svc.SvcId)
			if err != nil {
				return nil, err
			}
			if member && id != 0 {
				b, err := t.candidate(id)
				if err != nil {
					return nil, err
				}
				if !b.Missing {
					t.step(check, "flow hash %#08x, index %d of %d: backend %s", hash, idx, size, b.AddrPort())
					t.setSelection(&Selection{Method: MethodMaglev, Backend: b, MaglevIndex: &idx, MaglevTableSize: size, Note: "by the flow's hash" + note})
					return b, nil
				}
			}
			t.step(check, "flow hash %#08x, index %d of %d: backend #%d, not one the Service may choose: a random slot", hash, idx, size, id)
		}
	}
	if sel == nil {
		sel = &Selection{Method: MethodRandom, Note: fmt.Sprintf("slot random %% %d + 1", svc.Count) + note}
		t.step("selection", "%s", sel.Note)
	}
	t.setSelection(sel)
	return nil, nil
}

// setSelection keeps what affinity said (age, timeout) under the new
// choice.
func (t *tracer) setSelection(s *Selection) {
	if old := t.r.Selection; old != nil && old.Method == MethodAffinity {
		s.AffinityAgeSeconds, s.AffinityTimeoutSeconds = old.AffinityAgeSeconds, old.AffinityTimeoutSeconds
	}
	t.r.Selection = s
}

// snatFor is the source NAT address a new flow to b gets (np_record): a
// backend on another node that of the device the FIB sends it out of, else
// that of the device the packet came in on; one on this node under policy
// Cluster that of the device toward it when the agent attached there (the
// pod bridge in --devices); none under policy Local. The device is named.
func (t *tracer) snatFor(b Backend, extLocal bool) (netip.Addr, string, error) {
	if b.Local && extLocal {
		return netip.Addr{}, "", nil
	}
	m := t.env.Maps
	if t.env.Route != nil {
		if ifx, name, err := t.env.Route(b.Address); err == nil {
			a, ok, err := m.SNATAddr(uint32(ifx))
			if err != nil {
				return netip.Addr{}, "", err
			}
			if ok {
				return a, name, nil
			}
		}
	}
	if b.Local || t.in.Client.Ifindex == 0 {
		return netip.Addr{}, "", nil
	}
	a, ok, err := m.SNATAddr(uint32(t.in.Client.Ifindex))
	if !ok || err != nil {
		return netip.Addr{}, "", err
	}
	return a, t.in.Client.Device, nil
}

func (t *tracer) whyNAT(b Backend, extLocal bool) string {
	switch {
	case !b.Local:
		return "backend on another node"
	case extLocal:
		return "externalTrafficPolicy Local, backend on this node"
	}
	return "backend on this node under policy Cluster"
}

// snatRule says what source NAT the flow gets when the backend is not
// known yet.
func (t *tracer) snatRule(extLocal bool) {
	if extLocal {
		t.step("source NAT", "none: externalTrafficPolicy Local, every backend is on this node; the backend sees the client's address")
		return
	}
	t.step("source NAT", "a backend on another node: to the address of the device toward it and a free port; one on this node: none unless the agent attached to the device toward it (see each candidate's snat)")
}

// existingFlow explains a packet that follows its flow's entry e; the
// frontend's entry, when hasFrontend, lists the candidates.
func (t *tracer) existingFlow(fe maps.Frontend, svc maps.ServiceValue, hasFrontend bool, e maps.CTEntry) error {
	if hasFrontend {
		if err := t.candidates(fe, svc); err != nil {
			return err
		}
	}
	b, err := t.candidate(e.BackendID)
	if err != nil {
		return err
	}
	t.r.Selection = &Selection{Method: MethodExistingFlow, Backend: b, Note: "the flow's connection tracking entry keeps its backend"}
	if e.SNAT.IsValid() {
		t.r.SNAT = &SNAT{Address: e.SNAT.Addr(), Port: e.SNAT.Port()}
		t.step("source NAT", "the flow's: %s", e.SNAT)
	} else {
		t.step("source NAT", "none: the backend sees the client's address")
	}
	t.verdict(VerdictForward, RuleExistingFlow, fmt.Sprintf("translated to %s, as the flow's earlier packets", e.Backend))
	return nil
}

// flow describes a client-side entry and says whether it holds for a new
// connection's first packet (np_orig_valid: a TCP SYN or a UDP datagram).
func (t *tracer) flow(e maps.CTEntry) (Flow, error) {
	m := t.env.Maps
	now := uint32(t.env.Now.Seconds())
	f := Flow{Client: e.Client, Backend: e.Backend, SNAT: e.SNAT, BackendID: e.BackendID, Flags: maps.CTFlagNames(e.Flags),
		ExpiresInSeconds: int64(e.Expires) - int64(now)}
	expired := func(x maps.CTEntry) bool { return int32(now-x.Expires) > 0 }
	snat := e.Flags&maps.CTFlagSNAT != 0
	if !snat && expired(e) {
		return f, nil
	}
	member, err := m.Member(e.BackendID, e.SvcID)
	if err != nil || !member {
		return f, err
	}
	be, err := m.Backend(e.BackendID)
	if err != nil || be.Missing || netip.AddrPortFrom(be.Addr, be.Port) != e.Backend {
		return f, err
	}
	if !snat {
		f.Holds = true
		return f, nil
	}
	r, ok, err := m.Conntrack(e.Backend, e.SNAT, e.Proto, true)
	if err != nil {
		return f, err
	}
	if !ok {
		// Evicted from the LRU: the program takes the port back.
		f.Holds = !expired(e)
		return f, nil
	}
	f.Holds = r.Client == e.Client && !(expired(e) && expired(r))
	return f, nil
}

func orUnknown(s string) string {
	if s == "" {
		return "the device"
	}
	return s
}
