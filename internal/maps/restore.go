package maps

import (
	"fmt"
	"maps"
	"net/netip"
)

// restore rebuilds the applied state from what the kernel maps hold, so
// that ids survive a restart of the agent and a sync after an error starts
// from the truth.
func (a *applied) restore(m familyMaps) error {
	a.reset()
	err := m.backends.Iterate(func(id uint32, v backendEntry) bool {
		k := keyOf(v.b)
		ab := &appliedBackend{k: k, id: id, flags: v.flags}
		a.backends[k] = ab
		a.backendIDs.reserve(id)
		a.indexBackend(ab)
		a.gcBackends[k] = struct{}{}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore backends: %w", err)
	}
	revNatIDs := map[uint32]bool{}
	err = m.revNat.Iterate(func(id uint32, _ netip.AddrPort) bool {
		revNatIDs[id] = false
		a.revNatIDs.reserve(id)
		return true
	})
	if err != nil {
		return fmt.Errorf("restore reverse NAT: %w", err)
	}
	type slotEntry struct {
		fe   Frontend
		slot int
		id   uint32
	}
	var slotEntries []slotEntry
	err = m.services.Iterate(func(k serviceKey, v ServiceValue) bool {
		fe := k.fe
		af := a.frontends[fe]
		if af == nil {
			af = &appliedFrontend{}
			a.frontends[fe] = af
		}
		if k.slot != 0 {
			slotEntries = append(slotEntries, slotEntry{fe, int(k.slot), v.BackendId})
			return true
		}
		af.hasMaster = true
		af.revNat = v.RevNatId
		af.flags = v.Flags
		af.affinity = v.AffinityTimeout
		af.count = int(v.Count)
		af.svcID = v.SvcId
		return true
	})
	if err != nil {
		return fmt.Errorf("restore services: %w", err)
	}
	inKernel := map[MemberKey]bool{}
	err = m.members.Iterate(func(k MemberKey, _ uint8) bool {
		inKernel[k] = true
		a.matchRefs[k] = 0
		a.gcMatch[k] = struct{}{}
		return true
	})
	if err != nil {
		return fmt.Errorf("restore members: %w", err)
	}
	if m.maglev != nil {
		fps, err := m.maglev.Fingerprints()
		if err != nil {
			return fmt.Errorf("restore maglev tables: %w", err)
		}
		maps.Copy(a.maglev, fps)
	}
	if m.ranges != nil {
		// Claimed again by the ServicePorts that want them; the first
		// full sync deletes the rest.
		err := m.ranges.Iterate(func(k rangeKey, _ uint8) bool {
			a.orphanRanges[k] = struct{}{}
			return true
		})
		if err != nil {
			return fmt.Errorf("restore source ranges: %w", err)
		}
	}
	for _, s := range slotEntries {
		af := a.frontends[s.fe]
		for len(af.slots) < s.slot {
			af.slots = append(af.slots, 0)
		}
		af.slots[s.slot-1] = s.id
	}
	for fe, af := range a.frontends {
		for len(af.slots) < af.count {
			af.slots = append(af.slots, 0)
		}
		a.serviceEntries += af.entries()
		for i, id := range af.slots {
			rec := a.backendByID(id)
			if rec == nil || i >= af.count {
				continue
			}
			a.backends[rec.k].refs++
		}
		if af.svcID != 0 {
			a.svcIDs.reserve(af.svcID)
			a.svcRefs[af.svcID]++
		}
		if af.hasMaster {
			for _, id := range af.slots[:min(af.count, len(af.slots))] {
				k := MemberKey{BackendId: id, SvcId: af.svcID}
				if inKernel[k] {
					af.matchIDs = append(af.matchIDs, id)
					a.matchRefs[k]++
				}
			}
		}
		if af.hasMaster {
			if _, ok := revNatIDs[af.revNat]; ok {
				k := revNatKey{fe.Addr, fe.Port, fe.Proto}
				rn := a.revNats[k]
				if rn == nil {
					rn = &appliedRevNat{id: af.revNat}
					a.revNats[k] = rn
				}
				rn.refs++
				revNatIDs[af.revNat] = true
			} else {
				// A master without its reverse entry: rewrite both.
				af.revNat = 0
			}
		}
	}
	for id, used := range revNatIDs {
		if !used {
			a.orphanRevNats = append(a.orphanRevNats, id)
		}
	}
	if m.ports != nil {
		return a.restorePorts(m.ports)
	}
	return nil
}
