/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service lookup and backend selection, written once for every hook. */
#ifndef EBPF_PROXY_LB_H
#define EBPF_PROXY_LB_H

#include "maps.h"

/* lb4_lookup_service finds the master entry of a frontend for a client of
 * the given scope. Clients inside the cluster get the LB_SCOPE_INT entry
 * when the frontend has one. */
static __always_inline struct lb4_service *lb4_lookup_service(struct lb4_key *key, __u8 scope)
{
	struct lb4_service *svc, *isvc;

	key->slot = 0;
	key->scope = LB_SCOPE_EXT;
	svc = bpf_map_lookup_elem(&lb4_services_v1, key);
	if (!svc || scope == LB_SCOPE_EXT || !(svc->flags & SVC_F_TWO_SCOPES))
		return svc;
	key->scope = LB_SCOPE_INT;
	isvc = bpf_map_lookup_elem(&lb4_services_v1, key);
	if (isvc)
		return isvc;
	/* The writer creates the internal entry first; should it be missing,
	 * the external verdict beats an untranslated socket. */
	key->scope = LB_SCOPE_EXT;
	return svc;
}

/* lb4_random_backend picks one backend of a forwarding frontend at random.
 * key must be the one lb4_lookup_service filled in. Returns the backend
 * and its id, or NULL when the maps are inconsistent (counted: the writer
 * orders its updates so that this cannot happen). */
static __always_inline struct lb4_backend *
lb4_random_backend(struct lb4_key *key, const struct lb4_service *svc, __u32 *backend_id)
{
	struct lb4_service *slot;
	struct lb4_backend *be;
	__u32 id;

	key->slot = (bpf_get_prandom_u32() % svc->count) + 1;
	slot = bpf_map_lookup_elem(&lb4_services_v1, key);
	if (!slot) {
		lb_count(LB_M_NO_SLOT);
		return NULL;
	}
	id = slot->backend_id;
	be = bpf_map_lookup_elem(&lb4_backends_v1, &id);
	if (!be) {
		lb_count(LB_M_NO_BACKEND);
		return NULL;
	}
	*backend_id = id;
	return be;
}

/* lb4_member_backend returns backend_id's backend if the ServicePort svc_id
 * may still choose it, else NULL. */
static __always_inline struct lb4_backend *lb4_member_backend(__u32 backend_id, __u32 svc_id)
{
	struct lb4_member_key mkey = {
		.backend_id = backend_id,
		.svc_id = svc_id,
	};

	if (!bpf_map_lookup_elem(&lb4_members_v1, &mkey))
		return NULL;
	return bpf_map_lookup_elem(&lb4_backends_v1, &mkey.backend_id);
}

/* lb4_affinity_backend returns the backend a client used last for the
 * ServicePort of svc when that was within the affinity timeout and the
 * backend is still one the ServicePort may choose, and refreshes the entry's
 * time of use. Otherwise it returns NULL (a new choice must be recorded with
 * lb4_affinity_record, as lb4_choose_backend does). */
static __always_inline struct lb4_backend *lb4_affinity_backend(const struct lb4_affinity_key *akey,
								const struct lb4_service *svc,
								__u64 now, __u32 *backend_id)
{
	struct lb4_affinity *aff;
	struct lb4_backend *be;
	__u32 id;

	aff = bpf_map_lookup_elem(&lb4_affinity_v1, akey);
	if (!aff)
		return NULL;
	id = aff->backend_id;
	if (now - aff->last_used_ns > (__u64)svc->affinity_timeout * 1000000000ULL)
		goto stale;
	be = lb4_member_backend(id, svc->svc_id);
	if (!be)
		goto stale;
	aff->last_used_ns = now;
	*backend_id = id;
	lb_count(LB_M_AFFINITY_HIT);
	return be;
stale:
	lb_count(LB_M_AFFINITY_STALE);
	bpf_map_delete_elem(&lb4_affinity_v1, akey);
	return NULL;
}

static __always_inline void lb4_affinity_record(const struct lb4_affinity_key *akey, __u64 now,
						__u32 backend_id)
{
	struct lb4_affinity val = {
		.last_used_ns = now,
		.backend_id = backend_id,
	};

	bpf_map_update_elem(&lb4_affinity_v1, akey, &val, BPF_ANY);
}

/* lb4_new_backend makes a new choice for svc: maglev_id's backend when the
 * ServicePort may still choose it (a stale table entry falls through), else
 * one at random. */
static __always_inline struct lb4_backend *lb4_new_backend(struct lb4_key *key,
							   const struct lb4_service *svc,
							   __u32 maglev_id, __u32 *backend_id)
{
	struct lb4_backend *be;

	if (maglev_id) {
		be = lb4_member_backend(maglev_id, svc->svc_id);
		if (be) {
			*backend_id = maglev_id;
			lb_count(LB_M_MAGLEV);
			return be;
		}
	}
	return lb4_random_backend(key, svc, backend_id);
}

/* lb4_choose_backend chooses the backend of a new connection or flow to
 * svc, the one decision every hook makes: under session affinity the
 * backend remembered for the client while it holds, else a new choice that
 * is then remembered for the client. What differs between the hooks comes
 * in as arguments: whom affinity tells apart (client, of client_kind: the
 * socket hooks a network namespace cookie, TC and XDP the client's
 * address), and maglev_id, the backend id the ServicePort's Maglev table
 * holds for the flow (TC and XDP) or 0 to choose at random (the socket
 * hooks, and ServicePorts without a table). key must be the one
 * lb4_lookup_service filled in. Returns the backend and its id, or NULL
 * when the maps are inconsistent (counted). */
static __always_inline struct lb4_backend *lb4_choose_backend(struct lb4_key *key,
							      const struct lb4_service *svc,
							      __u64 client, __u8 client_kind,
							      __u32 maglev_id, __u32 *backend_id)
{
	struct lb4_affinity_key akey = {
		.client = client,
		.svc_id = svc->svc_id,
		.client_kind = client_kind,
	};
	struct lb4_backend *be;
	__u64 now;

	if (!svc->affinity_timeout)
		return lb4_new_backend(key, svc, maglev_id, backend_id);
	now = bpf_ktime_get_ns();
	be = lb4_affinity_backend(&akey, svc, now, backend_id);
	if (be)
		return be;
	be = lb4_new_backend(key, svc, maglev_id, backend_id);
	if (be)
		lb4_affinity_record(&akey, now, *backend_id);
	return be;
}

#endif /* EBPF_PROXY_LB_H */
