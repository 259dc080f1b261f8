package maps

import (
	"fmt"
)

// restore rebuilds the applied state from what the kernel maps hold, so
// that ids survive a restart of the agent and a sync after an error starts
// from the truth.
func (a *applied) restore(m familyMaps) error {
	a.reset()
	if err := a.backends.restore(m.backends); err != nil {
		return err
	}
	revNatIDs, err := a.revNats.restore(m.revNat)
	if err != nil {
		return err
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
	inKernel, err := a.members.restore(m.members)
	if err != nil {
		return err
	}
	if err := a.maglev.restore(m.maglev); err != nil {
		return err
	}
	if err := a.ranges.restore(m.ranges); err != nil {
		return err
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
			rec := a.backends.byIDOf(id)
			if rec == nil || i >= af.count {
				continue
			}
			rec.refs++
		}
		if af.svcID != 0 {
			a.svcs.restoreRef(af.svcID)
		}
		if af.hasMaster {
			for _, id := range af.slots[:min(af.count, len(af.slots))] {
				k := MemberKey{BackendId: id, SvcId: af.svcID}
				if inKernel[k] {
					af.matchIDs = append(af.matchIDs, id)
					a.members.ref(k)
				}
			}
		}
		if af.hasMaster {
			if _, ok := revNatIDs[af.revNat]; ok {
				a.revNats.claim(fe, af.revNat)
				revNatIDs[af.revNat] = true
			} else {
				// A master without its reverse entry: rewrite both.
				af.revNat = 0
			}
		}
	}
	for id, used := range revNatIDs {
		if !used {
			a.revNats.orphans = append(a.revNats.orphans, id)
		}
	}
	if err := a.ports.restore(m.ports); err != nil || m.ports == nil {
		return err
	}
	return a.addExternalPorts(m.ports)
}
