package dump

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ebpf-proxy/ebpf-proxy/internal/api"
	"github.com/ebpf-proxy/ebpf-proxy/internal/maps"
)

// The views of `ebpf-proxy dump conntrack|affinity|maglev|source-ranges`:
// each is built by a pure function from what the maps hold (maps.Read*),
// the services map's frontends (to name ids) and the agent's answer.

// Views.
const (
	ViewConntrack    = "conntrack"
	ViewAffinity     = "affinity"
	ViewMaglev       = "maglev"
	ViewSourceRanges = "source-ranges"
	ViewCounters     = "counters"
)

// ConntrackReport is what `ebpf-proxy dump conntrack -o json` prints:
//
//	{
//	  "named": true, "node": "node-a",
//	  "flows": [{                        // sorted by client, frontend, protocol, direction
//	    "ipFamily": "IPv4", "protocol": "TCP",
//	    "direction": "original",         // original: keyed by the client's packets; reply: by the backend's
//	    "client": "192.0.2.7:40112",
//	    "frontend": "10.0.0.1:30080",    // the Service address the client sent to
//	    "backend": "10.244.1.3:8080",    // empty in a reply entry (it names its backend by id)
//	    "snat": "10.0.0.1:61001",        // the node's address and port under source NAT, empty without
//	    "service": {"namespace": "default", "name": "web", "port": "http", "serviceID": 2},
//	    "backendID": 1,
//	    "flags": "snat",                 // snat, closing, fin-orig, fin-reply, fin-reply-first, closed, syn-wait, replied, stream; "-" for none
//	    "expiresInSeconds": 7430,        // negative: expired, the tuple selects again
//	    "ageSeconds": 12                 // since the entry was made (modulo 18 h)
//	  }]
//	}
//
// The service is named by the frontend (address, port, protocol) as the
// services view joins it.
type ConntrackReport struct {
	Named bool        `json:"named"`
	Node  string      `json:"node,omitempty"`
	Flows []Conntrack `json:"flows"`
}

// Conntrack is one conntrack entry.
type Conntrack struct {
	IPFamily         string         `json:"ipFamily"`
	Protocol         string         `json:"protocol"`
	Direction        string         `json:"direction"`
	Client           netip.AddrPort `json:"client"`
	Frontend         netip.AddrPort `json:"frontend"`
	Backend          netip.AddrPort `json:"backend,omitzero"`
	SNAT             netip.AddrPort `json:"snat,omitzero"`
	Service          ServiceRef     `json:"service"`
	BackendID        uint32         `json:"backendID"`
	Flags            string         `json:"flags"`
	ExpiresInSeconds int64          `json:"expiresInSeconds"`
	AgeSeconds       int64          `json:"ageSeconds"`
}

// Conntrack directions.
const (
	DirectionOriginal = "original"
	DirectionReply    = "reply"
)

// CTFamily is what one family's conntrack map holds.
type CTFamily struct {
	Name    string // IPv4 or IPv6
	Entries []maps.CTEntry
}

// BuildConntrack names the conntrack entries of cts and keeps those o
// selects; now is CLOCK_MONOTONIC (bpf_ktime_get_ns).
func BuildConntrack(cts []CTFamily, fams []Family, names *api.Services, now time.Duration, o Options) ConntrackReport {
	r := ConntrackReport{Named: names != nil, Flows: []Conntrack{}}
	if names != nil {
		r.Node = names.Node
	}
	n := newNamer(fams, names)
	sec := int64(now / time.Second)
	for _, fam := range cts {
		for _, e := range fam.Entries {
			proto := e.Proto.String()
			sp := n.byFrontend[feKey{e.Frontend.Addr().Unmap(), e.Frontend.Port(), proto}]
			c := Conntrack{IPFamily: fam.Name, Protocol: proto, Direction: DirectionOriginal,
				Client: e.Client, Frontend: e.Frontend, Backend: e.Backend, SNAT: e.SNAT,
				Service: ref(sp, e.SvcID), BackendID: e.BackendID, Flags: maps.CTFlagNames(e.Flags),
				ExpiresInSeconds: int64(e.Expires) - sec, AgeSeconds: int64(uint16(sec) - e.Born)}
			if e.Reply {
				c.Direction = DirectionReply
			}
			if !o.matches(c.Service, proto) || !o.hasAddress(c.Client, c.Frontend, c.Backend, c.SNAT) {
				continue
			}
			r.Flows = append(r.Flows, c)
		}
	}
	return r
}

// WriteConntrackTable writes one line per flow: the Service, protocol,
// client, frontend, backend, source NAT, flags (of both its entries) and
// expiry (the later of its entries'). wide writes one line per entry
// instead, with its direction, the ids and its age.
func WriteConntrackTable(w io.Writer, r ConntrackReport, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "SERVICE\tPROTO\tCLIENT\tFRONTEND\tBACKEND\tSNAT\tFLAGS\tEXPIRES"
	if wide {
		head = "SERVICE\tPROTO\tDIR\tCLIENT\tFRONTEND\tBACKEND\tSNAT\tSVC-ID\tBACKEND-ID\tFLAGS\tEXPIRES\tAGE"
	}
	fmt.Fprintln(tw, head)
	flows := r.Flows
	if !wide {
		flows = mergeDirections(flows)
	}
	for _, c := range flows {
		cols := []string{c.Service.String(), c.Protocol}
		if wide {
			cols = append(cols, c.Direction)
		}
		cols = append(cols, c.Client.String(), c.Frontend.String(), orDash(c.Backend), orDash(c.SNAT))
		if wide {
			cols = append(cols, strconv.FormatUint(uint64(c.Service.ServiceID), 10), strconv.FormatUint(uint64(c.BackendID), 10))
		}
		cols = append(cols, c.Flags, expiry(c.ExpiresInSeconds))
		if wide {
			cols = append(cols, strconv.FormatInt(c.AgeSeconds, 10)+"s")
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

// mergeDirections folds a flow's reply entry into its original one (they
// are adjacent in a report's order): the flags of both, the later expiry,
// the backend of either.
func mergeDirections(fs []Conntrack) []Conntrack {
	var out []Conntrack
	for _, f := range fs {
		if n := len(out); n > 0 && f.Direction == DirectionReply {
			p := &out[n-1]
			if p.Direction == DirectionOriginal && p.IPFamily == f.IPFamily && p.Protocol == f.Protocol &&
				p.Client == f.Client && p.Frontend == f.Frontend {
				p.Flags = unionFlags(p.Flags, f.Flags)
				p.ExpiresInSeconds = max(p.ExpiresInSeconds, f.ExpiresInSeconds)
				if !p.Backend.IsValid() {
					p.Backend = f.Backend
				}
				p.Direction = ""
				continue
			}
		}
		out = append(out, f)
	}
	return out
}

// unionFlags joins two flag lists as CTFlagNames spells them, in the
// order of maps.CTFlagNames.
func unionFlags(a, b string) string {
	var fs []string
	for _, s := range []string{a, b} {
		for _, f := range strings.Split(s, ",") {
			if f != "-" && !slices.Contains(fs, f) {
				fs = append(fs, f)
			}
		}
	}
	order := strings.Split(maps.CTFlagNames(^uint16(0)), ",")
	slices.SortStableFunc(fs, func(x, y string) int {
		return slices.Index(order, x) - slices.Index(order, y)
	})
	if len(fs) == 0 {
		return "-"
	}
	return strings.Join(fs, ",")
}

func orDash(ap netip.AddrPort) string {
	if !ap.IsValid() {
		return "-"
	}
	return ap.String()
}

func expiry(s int64) string {
	if s < 0 {
		return "expired"
	}
	return strconv.FormatInt(s, 10) + "s"
}

// AffinityReport is what `ebpf-proxy dump affinity -o json` prints:
//
//	{
//	  "named": true, "node": "node-a",
//	  "entries": [{                      // sorted by family, service id, client
//	    "ipFamily": "IPv4", "protocol": "TCP",
//	    "client": "192.0.2.7",           // a client from outside (TC), or
//	    "netnsCookie": 4097,             // the network namespace of the node's sockets (a pod, or the node)
//	    "service": {"namespace": "default", "name": "web", "serviceID": 2},
//	    "frontends": ["10.96.0.80:80"],  // the ServicePort's frontends in the services map
//	    "backend": "10.244.1.3:8080",    // empty when the backends map lacks backendID
//	    "backendID": 1,
//	    "ageSeconds": 3                  // since its last use; the entry holds while younger than the Service's timeout
//	  }]
//	}
type AffinityReport struct {
	Named   bool       `json:"named"`
	Node    string     `json:"node,omitempty"`
	Entries []Affinity `json:"entries"`
}

// Affinity is one session affinity entry.
type Affinity struct {
	IPFamily    string           `json:"ipFamily"`
	Protocol    string           `json:"protocol,omitempty"`
	Client      netip.Addr       `json:"client,omitzero"`
	NetnsCookie uint64           `json:"netnsCookie,omitempty"`
	Service     ServiceRef       `json:"service"`
	Frontends   []netip.AddrPort `json:"frontends"`
	Backend     netip.AddrPort   `json:"backend,omitzero"`
	BackendID   uint32           `json:"backendID"`
	AgeSeconds  float64          `json:"ageSeconds"`
}

// AffinityFamily is what one family's affinity map holds.
type AffinityFamily struct {
	Name    string
	Entries []maps.AffinityEntry
}

// BuildAffinity names the affinity entries and keeps those o selects; now
// is CLOCK_MONOTONIC.
func BuildAffinity(afs []AffinityFamily, fams []Family, names *api.Services, now time.Duration, o Options) AffinityReport {
	r := AffinityReport{Named: names != nil, Entries: []Affinity{}}
	if names != nil {
		r.Node = names.Node
	}
	n := newNamer(fams, names)
	for _, fam := range afs {
		for _, e := range fam.Entries {
			a := Affinity{IPFamily: fam.Name, Protocol: n.protocolOf(fam.Name, e.SvcID), Client: e.ClientAddr,
				NetnsCookie: e.NetnsCookie, Service: n.byID(fam.Name, e.SvcID), Frontends: n.frontendsOf(fam.Name, e.SvcID, 0),
				Backend: n.fam(fam.Name).backends[e.BackendID], BackendID: e.BackendID,
				AgeSeconds: (now - time.Duration(e.LastUsedNs)).Round(time.Millisecond).Seconds()}
			aps := append([]netip.AddrPort{a.Backend, netip.AddrPortFrom(a.Client, 0)}, a.Frontends...)
			if !o.matches(a.Service, a.Protocol) || !o.hasAddress(aps...) {
				continue
			}
			r.Entries = append(r.Entries, a)
		}
	}
	return r
}

// WriteAffinityTable writes one line per entry: the Service, its
// frontends, the client, the backend and the age; wide adds the ids.
func WriteAffinityTable(w io.Writer, r AffinityReport, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "SERVICE\tPROTO\tFRONTENDS\tCLIENT\tBACKEND\tAGE"
	if wide {
		head = "SERVICE\tPROTO\tFRONTENDS\tCLIENT\tBACKEND\tSVC-ID\tBACKEND-ID\tAGE"
	}
	fmt.Fprintln(tw, head)
	for _, a := range r.Entries {
		client := "netns:" + strconv.FormatUint(a.NetnsCookie, 10)
		if a.Client.IsValid() {
			client = a.Client.String()
		}
		cols := []string{a.Service.String(), orDashS(a.Protocol), joinAddrPorts(a.Frontends), client, orDash(a.Backend)}
		if wide {
			cols = append(cols, strconv.FormatUint(uint64(a.Service.ServiceID), 10), strconv.FormatUint(uint64(a.BackendID), 10))
		}
		cols = append(cols, strconv.FormatFloat(a.AgeSeconds, 'f', 1, 64)+"s")
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

func orDashS(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func joinAddrPorts(aps []netip.AddrPort) string {
	if len(aps) == 0 {
		return "-"
	}
	s := make([]string, len(aps))
	for i, ap := range aps {
		s[i] = ap.String()
	}
	return strings.Join(s, ",")
}

// MaglevReport is what `ebpf-proxy dump maglev -o json` prints:
//
//	{
//	  "named": true, "node": "node-a",
//	  "tables": [{                       // one per ServicePort with a Maglev table, by family and service id
//	    "ipFamily": "IPv4", "protocol": "TCP",
//	    "service": {"namespace": "default", "name": "web", "serviceID": 2},
//	    "frontends": ["10.0.0.1:30080"], // the ServicePort's frontends in the services map
//	    "size": 16381,                   // slots of the table (a prime)
//	    "backends": [{"address": "10.244.1.3", "port": 8080, "id": 1, "slots": 8191}] // by id; address empty if the backends map lacks it
//	  }]
//	}
type MaglevReport struct {
	Named  bool     `json:"named"`
	Node   string   `json:"node,omitempty"`
	Tables []Maglev `json:"tables"`
}

// Maglev is one Maglev table.
type Maglev struct {
	IPFamily  string           `json:"ipFamily"`
	Protocol  string           `json:"protocol,omitempty"`
	Service   ServiceRef       `json:"service"`
	Frontends []netip.AddrPort `json:"frontends"`
	Size      int              `json:"size"`
	Backends  []MaglevBackend  `json:"backends"`
}

// MaglevBackend is a backend of a Maglev table and how many slots it holds.
type MaglevBackend struct {
	Address netip.Addr `json:"address,omitzero"`
	Port    uint16     `json:"port,omitempty"`
	ID      uint32     `json:"id"`
	Slots   int        `json:"slots"`
}

// MaglevFamily is what one family's Maglev maps hold.
type MaglevFamily struct {
	Name   string
	Tables []maps.MaglevEntry
}

// BuildMaglev names the Maglev tables and keeps those o selects.
func BuildMaglev(mfs []MaglevFamily, fams []Family, names *api.Services, o Options) MaglevReport {
	r := MaglevReport{Named: names != nil, Tables: []Maglev{}}
	if names != nil {
		r.Node = names.Node
	}
	n := newNamer(fams, names)
	for _, fam := range mfs {
		for _, t := range fam.Tables {
			m := Maglev{IPFamily: fam.Name, Protocol: n.protocolOf(fam.Name, t.SvcID), Service: n.byID(fam.Name, t.SvcID),
				Frontends: n.frontendsOf(fam.Name, t.SvcID, 0), Size: t.Size, Backends: []MaglevBackend{}}
			aps := slices.Clone(m.Frontends)
			for id, slots := range t.Slots {
				ap := n.fam(fam.Name).backends[id]
				m.Backends = append(m.Backends, MaglevBackend{Address: ap.Addr(), Port: ap.Port(), ID: id, Slots: slots})
				aps = append(aps, ap)
			}
			slices.SortFunc(m.Backends, func(a, b MaglevBackend) int { return int(a.ID) - int(b.ID) })
			if !o.matches(m.Service, m.Protocol) || !o.hasAddress(aps...) {
				continue
			}
			r.Tables = append(r.Tables, m)
		}
	}
	return r
}

// WriteMaglevTable writes one line per table: the Service, its frontends,
// the table size and each backend with its slots (address:port=slots);
// wide adds the ids.
func WriteMaglevTable(w io.Writer, r MaglevReport, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "SERVICE\tPROTO\tFRONTENDS\tSIZE\tBACKENDS"
	if wide {
		head = "SERVICE\tPROTO\tFRONTENDS\tSVC-ID\tSIZE\tBACKENDS"
	}
	fmt.Fprintln(tw, head)
	for _, m := range r.Tables {
		cols := []string{m.Service.String(), orDashS(m.Protocol), joinAddrPorts(m.Frontends)}
		if wide {
			cols = append(cols, strconv.FormatUint(uint64(m.Service.ServiceID), 10))
		}
		var bs []string
		for _, b := range m.Backends {
			s := "missing"
			if b.Address.IsValid() {
				s = netip.AddrPortFrom(b.Address, b.Port).String()
			}
			if wide {
				s = "#" + strconv.FormatUint(uint64(b.ID), 10) + " " + s
			}
			bs = append(bs, s+"="+strconv.Itoa(b.Slots))
		}
		if len(bs) == 0 {
			bs = []string{"-"}
		}
		cols = append(cols, strconv.Itoa(m.Size), strings.Join(bs, ", "))
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

// SourceRangesReport is what `ebpf-proxy dump source-ranges -o json`
// prints:
//
//	{
//	  "named": true, "node": "node-a",
//	  "frontends": [{                    // one per LoadBalancer frontend with source ranges, by family, service id, address
//	    "ipFamily": "IPv4", "protocol": "TCP",
//	    "service": {"namespace": "default", "name": "web", "serviceID": 2},
//	    "frontend": "192.0.2.10:80",     // empty when the services map has no such frontend for the id
//	    "cidrs": ["203.0.113.0/24", "192.0.2.10/32"], // the trie's ranges of the ServicePort (with its LoadBalancer IPs when a range holds a node address)
//	    "admitsNode": true               // a range holds a node address: the node's own sockets are admitted
//	  }]
//	}
type SourceRangesReport struct {
	Named     bool          `json:"named"`
	Node      string        `json:"node,omitempty"`
	Frontends []SourceRange `json:"frontends"`
}

// SourceRange is a frontend's source ranges.
type SourceRange struct {
	IPFamily   string         `json:"ipFamily"`
	Protocol   string         `json:"protocol,omitempty"`
	Service    ServiceRef     `json:"service"`
	Frontend   netip.AddrPort `json:"frontend,omitzero"`
	CIDRs      []netip.Prefix `json:"cidrs"`
	AdmitsNode bool           `json:"admitsNode"`
}

// RangeFamily is what one family's source ranges trie holds.
type RangeFamily struct {
	Name    string
	Entries []maps.SourceRangeEntry
}

// BuildSourceRanges groups the trie's entries by ServicePort and shows
// them for each of its frontends with source ranges, keeping those o
// selects.
func BuildSourceRanges(rfs []RangeFamily, fams []Family, names *api.Services, o Options) SourceRangesReport {
	r := SourceRangesReport{Named: names != nil, Frontends: []SourceRange{}}
	if names != nil {
		r.Node = names.Node
	}
	n := newNamer(fams, names)
	for _, fam := range rfs {
		var ids []uint32
		cidrs := map[uint32][]netip.Prefix{}
		node := map[uint32]bool{}
		for _, e := range fam.Entries {
			if _, ok := cidrs[e.SvcID]; !ok {
				ids = append(ids, e.SvcID)
				cidrs[e.SvcID] = []netip.Prefix{}
			}
			if e.Node {
				node[e.SvcID] = true
			} else {
				cidrs[e.SvcID] = append(cidrs[e.SvcID], e.Prefix)
			}
		}
		for _, id := range ids {
			fes := n.frontendsOf(fam.Name, id, maps.FlagSourceRanges)
			if len(fes) == 0 {
				fes = []netip.AddrPort{{}}
			}
			for _, fe := range fes {
				s := SourceRange{IPFamily: fam.Name, Protocol: n.protocolOf(fam.Name, id), Service: n.byID(fam.Name, id),
					Frontend: fe, CIDRs: cidrs[id], AdmitsNode: node[id]}
				if !o.matches(s.Service, s.Protocol) || !o.hasAddress(fe) && !rangesHold(s.CIDRs, o.Address) {
					continue
				}
				r.Frontends = append(r.Frontends, s)
			}
		}
	}
	return r
}

func rangesHold(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// WriteSourceRangesTable writes one line per frontend: the Service, the
// frontend, whether the node is admitted and the ranges; wide adds the id.
func WriteSourceRangesTable(w io.Writer, r SourceRangesReport, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	head := "SERVICE\tFRONTEND\tNODE\tRANGES"
	if wide {
		head = "SERVICE\tFRONTEND\tSVC-ID\tNODE\tRANGES"
	}
	fmt.Fprintln(tw, head)
	for _, s := range r.Frontends {
		fe := "-"
		if s.Frontend.IsValid() {
			fe = s.Frontend.String() + "/" + s.Protocol
		}
		cols := []string{s.Service.String(), fe}
		if wide {
			cols = append(cols, strconv.FormatUint(uint64(s.Service.ServiceID), 10))
		}
		node := "no"
		if s.AdmitsNode {
			node = "admitted"
		}
		rs := make([]string, len(s.CIDRs))
		for i, p := range s.CIDRs {
			rs[i] = p.String()
		}
		cols = append(cols, node, orDashS(strings.Join(rs, ",")))
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

// CountersReport is what `ebpf-proxy dump counters -o json` prints:
//
//	{
//	  "counters": [{                     // every event the programs count, in the programs' order
//	    "event": "translated_tcp",       // the event label of ebpfproxy_bpf_events_total
//	    "description": "socket: TCP connect() to a Service translated to a backend",
//	    "count": 12                      // since the map was made (summed over CPUs)
//	  }]
//	}
type CountersReport struct {
	Counters []Counter `json:"counters"`
}

// Counter is one event counter.
type Counter struct {
	Event       string `json:"event"`
	Description string `json:"description"`
	Count       uint64 `json:"count"`
}

// BuildCounters names the counts (indexed like names and descriptions).
func BuildCounters(counts []uint64, names, descriptions []string) CountersReport {
	r := CountersReport{Counters: []Counter{}}
	for i, c := range counts {
		e := Counter{Event: fmt.Sprintf("event_%d", i), Count: c}
		if i < len(names) {
			e.Event = names[i]
		}
		if i < len(descriptions) {
			e.Description = descriptions[i]
		}
		r.Counters = append(r.Counters, e)
	}
	return r
}

// WriteCountersTable writes one line per event that happened (every event
// with wide): its name, count and what it counts.
func WriteCountersTable(w io.Writer, r CountersReport, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT\tCOUNT\tDESCRIPTION")
	zero := 0
	for _, c := range r.Counters {
		if c.Count == 0 && !wide {
			zero++
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", c.Event, c.Count, c.Description)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if zero > 0 {
		_, err := fmt.Fprintf(w, "(%d events at 0 not shown; -o wide shows them)\n", zero)
		return err
	}
	return nil
}
