package trace

import (
	"fmt"
	"net/netip"

	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
	"github.com/ebpf-proxy/ebpf-proxy/internal/model"
)

// localhost4 is the frontend of localhost NodePorts for all of 127.0.0.0/8
// (sock4_loopback_frontend).
var localhost4 = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// socket follows sock_xlate_fwd (bpf/sock.c): a pod's or the node's
// connect() or sendmsg() to the destination.
func (t *tracer) socket() error {
	in, m := t.in, t.env.Maps
	addr := in.Dest.Addr()
	who := "the pod's"
	if in.Client.Kind == ClientNode {
		who = "the node's"
	}
	t.step("hook", "connect()/sendmsg() of %s socket: the cgroup socket programs translate it before any packet exists", who)
	if in.Proto != model.TCP && in.Proto != model.UDP {
		t.step("protocol", "%s: the socket programs translate TCP and UDP only", in.Proto)
		t.verdict(VerdictUntouched, RuleNoFrontend, fmt.Sprintf("the connection goes to %s untranslated", in.Dest))
		return nil
	}
	if addr.Is4() && addr.IsLoopback() {
		if in.Client.Kind != ClientNode {
			t.step("loopback", "%s is the pod's own loopback: 127.0.0.0/8 is looked up for the node's own sockets only", addr)
			t.verdict(VerdictUntouched, RuleLoopback, fmt.Sprintf("the connection goes to %s in the pod itself, untranslated", in.Dest))
			return nil
		}
		t.step("loopback", "%s from the node: looked up as %s (localhost NodePorts)", addr, localhost4)
		addr = localhost4
	}
	fe, svc, ok, err := m.LookupService(addr, in.Dest.Port(), in.Proto, maps.ScopeInternal)
	if err != nil {
		return err
	}
	check := fmt.Sprintf("services map: %s, slot 0", netip.AddrPortFrom(addr, in.Dest.Port()))
	if !ok {
		t.step(check, "no entry: not a Service frontend")
		t.verdict(VerdictUntouched, RuleNoFrontend, fmt.Sprintf("the connection goes to %s untranslated", in.Dest))
		return nil
	}
	t.frontend(fe, svc)
	t.step(check, "%s", t.describeMaster(fe, svc))
	node := in.Client.Kind == ClientNode
	udpFromNode := node && in.Proto == model.UDP && svc.Flags&(maps.FlagNodePort|maps.FlagLocalhostNodePort) == 0
	if svc.Flags&maps.FlagDrop != 0 {
		t.step("verdict", "drop flag: traffic policy %s with no endpoint on this node", policyOr(t.r.Frontend.TrafficPolicy, "Local"))
		out := "connect() or send() fails at once with ETIMEDOUT (kube-proxy's DROP makes the client time out)"
		if udpFromNode {
			out = "send() fails with EPERM (kube-proxy drops the node's own datagram in OUTPUT)"
		}
		t.verdict(VerdictDrop, RuleTrafficPolicyLocal, out)
		return nil
	}
	if svc.Flags&maps.FlagReject != 0 || svc.Count == 0 {
		t.step("verdict", "reject: no usable endpoint")
		out := "connect() or send() fails at once with ECONNREFUSED"
		if udpFromNode {
			out = "send() fails with EPERM (kube-proxy rejects the node's own datagram in OUTPUT)"
		}
		t.verdict(VerdictReject, RuleNoEndpoints, out)
		return nil
	}
	if err := t.candidates(fe, svc); err != nil {
		return err
	}
	var chosen *Backend
	switch {
	case svc.AffinityTimeout != 0 && in.Client.NetnsCookie != 0:
		e, found, err := m.AffinityOfNetns(in.Client.NetnsCookie, svc.SvcId)
		if err != nil {
			return err
		}
		if chosen, err = t.affinity(svc, e, found, fmt.Sprintf("netns %d", in.Client.NetnsCookie)); err != nil {
			return err
		}
		if chosen == nil {
			t.r.Selection.Method = MethodRandom
			t.r.Selection.Note = fmt.Sprintf("slot random %% %d + 1, then remembered for the client's network namespace", svc.Count)
		}
	case svc.AffinityTimeout != 0:
		t.step("affinity map", "session affinity (%ds) by the client's network namespace, which is not known: give --netns to look its entry up", svc.AffinityTimeout)
		t.r.Selection = &Selection{Method: MethodAffinity, AffinityTimeoutSeconds: int(svc.AffinityTimeout),
			Note: "the entry of the client's network namespace decides while it holds; else a random slot"}
	default:
		note := fmt.Sprintf("slot random %% %d + 1", svc.Count)
		if in.Proto == model.UDP {
			note += "; an unconnected UDP socket keeps its first choice while the backend may be chosen"
		}
		t.step("selection", "no session affinity; sockets never use Maglev: %s", note)
		t.r.Selection = &Selection{Method: MethodRandom, Note: note}
	}
	if chosen == nil {
		chosen = t.onlyCandidate()
	}
	if svc.Flags&maps.FlagSourceRanges != 0 {
		admitted, err := t.socketSourceRange(svc)
		if err != nil {
			return err
		}
		if !admitted {
			out := "connect()'s SYN is dropped at egress: it retransmits until it times out"
			switch {
			case in.Proto == model.UDP && node:
				out = "send() fails with EPERM"
			case in.Proto == model.UDP:
				out = "the datagram is lost without an error"
			}
			t.verdict(VerdictDrop, RuleSourceRange, out)
			return nil
		}
	}
	t.step("source NAT", "none: the socket connects to the backend itself, from its own address")
	t.step("connection tracking", "none: the socket programs keep no flow table (a socket keeps its backend)")
	out := fmt.Sprintf("connect() reaches one of %d backends; getpeername() shows %s", len(t.r.Candidates), in.Dest)
	if chosen != nil {
		out = fmt.Sprintf("connect() reaches %s; getpeername() shows %s", chosen.AddrPort(), in.Dest)
	}
	t.verdict(VerdictForward, RuleEndpoints, out)
	return nil
}

// socketSourceRange follows the egress program's check (range_check) of a
// socket sent through a LoadBalancer IP with source ranges.
func (t *tracer) socketSourceRange(svc maps.ServiceValue) (bool, error) {
	in, m := t.in, t.env.Maps
	check := fmt.Sprintf("source ranges map: ServicePort %d", svc.SvcId)
	if in.Client.Kind == ClientNode && !in.Client.Addr.IsValid() {
		ok, err := m.SourceRangeAdmitsNode(svc.SvcId)
		if err != nil {
			return false, err
		}
		if ok {
			t.step(check, "a range holds a node address: the node's sockets are admitted")
		} else {
			t.step(check, "no range holds a node address: the node's packets are dropped at egress")
		}
		return ok, nil
	}
	if !in.Client.Addr.IsValid() {
		t.step(check, "the client's source address is not known: give --pod to check it")
		// Unknown: the verdict stays what the other maps say.
		return true, nil
	}
	ok, err := m.SourceRangeAdmits(svc.SvcId, in.Client.Addr)
	if err != nil {
		return false, err
	}
	if ok {
		t.step(check, "%s is within the ranges: admitted", in.Client.Addr)
	} else {
		t.step(check, "%s is outside every range: its packets are dropped at egress", in.Client.Addr)
	}
	return ok, nil
}

// describeMaster spells a master entry found.
func (t *tracer) describeMaster(fe maps.Frontend, svc maps.ServiceValue) string {
	f := t.r.Frontend
	s := fmt.Sprintf("%s %s", f.Service, f.Kind)
	if fe.Scope == maps.ScopeInternal {
		s += ", its internal entry (for clients on the node; the external one says two-scopes)"
	}
	if f.TrafficPolicy != "" {
		s += ", policy " + f.TrafficPolicy
	}
	s += fmt.Sprintf("; flags %s, backend slots: %d, ServicePort %d", f.Flags, svc.Count, svc.SvcId)
	if svc.AffinityTimeout != 0 {
		s += fmt.Sprintf(", session affinity %ds", svc.AffinityTimeout)
	}
	return s
}
