/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service lookup and backend selection, written once for every hook and
 * both address families.
 *
 * The lb_* helpers take the family as an argument, v6, which is a constant
 * at every call: after inlining the compiler keeps the one family's maps and
 * key layout. A key is a struct lb4_key or a struct lb6_key, a backend a
 * struct lb4_backend or a struct lb6_backend; service entries, memberships
 * and affinity values have one layout for both. The lb4_* helpers are the
 * IPv4 ones, which the TC and XDP programs use. */
#ifndef EBPF_PROXY_LB_H
#define EBPF_PROXY_LB_H

#include "maps.h"

static __always_inline void *lb_services_map(bool v6)
{
	return v6 ? (void *)&lb6_services_v1 : (void *)&lb4_services_v1;
}

static __always_inline void *lb_backends_map(bool v6)
{
	return v6 ? (void *)&lb6_backends_v1 : (void *)&lb4_backends_v1;
}

static __always_inline void *lb_members_map(bool v6)
{
	return v6 ? (void *)&lb6_members_v1 : (void *)&lb4_members_v1;
}

static __always_inline void *lb_affinity_map(bool v6)
{
	return v6 ? (void *)&lb6_affinity_v1 : (void *)&lb4_affinity_v1;
}

/* LB_BE names a field that struct lb6_backend and struct lb4_backend share,
 * of the family v6 says; LB_BE_ADDR the address, as a pointer to its words
 * (as ct.h's CT_E and CT_E_ADDR). */
#define LB_BE(be, v6, f)                                                                           \
	(*((v6) ? &((struct lb6_backend *)(be))->f : &((struct lb4_backend *)(be))->f))
#define LB_BE_ADDR(be, v6)                                                                         \
	((v6) ? ((struct lb6_backend *)(be))->address : &((struct lb4_backend *)(be))->address)

/* lb_key_set points key, of family v6, at a slot and a scope. */
static __always_inline void lb_key_set(void *key, bool v6, __u16 slot, __u8 scope)
{
	if (v6) {
		((struct lb6_key *)key)->slot = slot;
		((struct lb6_key *)key)->scope = scope;
	} else {
		((struct lb4_key *)key)->slot = slot;
		((struct lb4_key *)key)->scope = scope;
	}
}

static __always_inline void lb_key_set_slot(void *key, bool v6, __u16 slot)
{
	if (v6)
		((struct lb6_key *)key)->slot = slot;
	else
		((struct lb4_key *)key)->slot = slot;
}

/* lb_lookup_service finds the master entry of a frontend for a client of
 * the given scope. Clients inside the cluster get the LB_SCOPE_INT entry
 * when the frontend has one. */
static __always_inline struct lb4_service *lb_lookup_service(void *key, bool v6, __u8 scope)
{
	struct lb4_service *svc, *isvc;

	lb_key_set(key, v6, 0, LB_SCOPE_EXT);
	svc = bpf_map_lookup_elem(lb_services_map(v6), key);
	if (!svc || scope == LB_SCOPE_EXT || !(svc->flags & SVC_F_TWO_SCOPES))
		return svc;
	lb_key_set(key, v6, 0, LB_SCOPE_INT);
	isvc = bpf_map_lookup_elem(lb_services_map(v6), key);
	if (isvc)
		return isvc;
	/* The writer creates the internal entry first; should it be missing,
	 * the external verdict beats an untranslated socket. */
	lb_key_set(key, v6, 0, LB_SCOPE_EXT);
	return svc;
}

/* lb_random_backend picks one backend of a forwarding frontend at random.
 * key must be the one lb_lookup_service filled in. Returns the backend
 * and its id, or NULL when the maps are inconsistent (counted: the writer
 * orders its updates so that this cannot happen). */
static __always_inline void *lb_random_backend(void *key, bool v6, const struct lb4_service *svc,
					       __u32 *backend_id)
{
	struct lb4_service *slot;
	void *be;
	__u32 id;

	lb_key_set_slot(key, v6, (bpf_get_prandom_u32() % svc->count) + 1);
	slot = bpf_map_lookup_elem(lb_services_map(v6), key);
	if (!slot) {
		lb_count(LB_M_NO_SLOT);
		return NULL;
	}
	id = slot->backend_id;
	be = bpf_map_lookup_elem(lb_backends_map(v6), &id);
	if (!be) {
		lb_count(LB_M_NO_BACKEND);
		return NULL;
	}
	*backend_id = id;
	return be;
}

/* lb_member_backend returns backend_id's backend if the ServicePort svc_id
 * may still choose it, else NULL. */
static __always_inline void *lb_member_backend(bool v6, __u32 backend_id, __u32 svc_id)
{
	struct lb4_member_key mkey = {
		.backend_id = backend_id,
		.svc_id = svc_id,
	};

	if (!bpf_map_lookup_elem(lb_members_map(v6), &mkey))
		return NULL;
	return bpf_map_lookup_elem(lb_backends_map(v6), &mkey.backend_id);
}

/* lb_affinity_backend returns the backend a client used last for the
 * ServicePort of svc when that was within the affinity timeout and the
 * backend is still one the ServicePort may choose, and refreshes the entry's
 * time of use. Otherwise it returns NULL (a new choice must be recorded with
 * lb_affinity_record, as lb_choose_backend does). akey is a struct
 * lb4_affinity_key or a struct lb6_affinity_key. */
static __always_inline void *lb_affinity_backend(bool v6, const void *akey,
						 const struct lb4_service *svc, __u64 now,
						 __u32 *backend_id)
{
	struct lb4_affinity *aff;
	void *be;
	__u32 id;

	aff = bpf_map_lookup_elem(lb_affinity_map(v6), akey);
	if (!aff)
		return NULL;
	id = aff->backend_id;
	if (now - aff->last_used_ns > (__u64)svc->affinity_timeout * 1000000000ULL)
		goto stale;
	be = lb_member_backend(v6, id, svc->svc_id);
	if (!be)
		goto stale;
	aff->last_used_ns = now;
	*backend_id = id;
	lb_count(LB_M_AFFINITY_HIT);
	return be;
stale:
	lb_count(LB_M_AFFINITY_STALE);
	bpf_map_delete_elem(lb_affinity_map(v6), akey);
	return NULL;
}

static __always_inline void lb_affinity_record(bool v6, const void *akey, __u64 now,
					       __u32 backend_id)
{
	struct lb4_affinity val = {
		.last_used_ns = now,
		.backend_id = backend_id,
	};

	bpf_map_update_elem(lb_affinity_map(v6), akey, &val, BPF_ANY);
}

/* lb_new_backend makes a new choice for svc: maglev_id's backend when the
 * ServicePort may still choose it (a stale table entry falls through), else
 * one at random. */
static __always_inline void *lb_new_backend(void *key, bool v6, const struct lb4_service *svc,
					    __u32 maglev_id, __u32 *backend_id)
{
	void *be;

	if (maglev_id) {
		be = lb_member_backend(v6, maglev_id, svc->svc_id);
		if (be) {
			*backend_id = maglev_id;
			lb_count(LB_M_MAGLEV);
			return be;
		}
	}
	return lb_random_backend(key, v6, svc, backend_id);
}

/* lb_affine_backend chooses the backend of a new connection or flow to svc
 * under session affinity: the backend remembered for the client (akey, a
 * struct lb6_affinity_key or struct lb4_affinity_key) while it holds, else
 * a new choice (lb_new_backend) that is then remembered for it. */
static __always_inline void *lb_affine_backend(void *key, bool v6, const struct lb4_service *svc,
					       const void *akey, __u32 maglev_id, __u32 *backend_id)
{
	__u64 now = bpf_ktime_get_ns();
	void *be;

	be = lb_affinity_backend(v6, akey, svc, now, backend_id);
	if (be)
		return be;
	be = lb_new_backend(key, v6, svc, maglev_id, backend_id);
	if (be)
		lb_affinity_record(v6, akey, now, *backend_id);
	return be;
}

/* lb_choose_backend chooses the backend of a new connection or flow to
 * svc, the one decision every hook makes: under session affinity the
 * backend remembered for the client while it holds, else a new choice that
 * is then remembered for the client. What differs between the hooks comes
 * in as arguments: whom affinity tells apart (client, of client_kind: the
 * socket hooks a network namespace cookie; TC and XDP, whose clients are
 * addresses, build their key themselves for lb_affine_backend), and
 * maglev_id, the backend id the ServicePort's Maglev table holds for the
 * flow (TC and XDP) or 0 to choose at random (the socket hooks, and
 * ServicePorts without a table). key must be the one lb_lookup_service
 * filled in. Returns the backend and its id, or NULL when the maps are
 * inconsistent (counted). */
static __always_inline void *lb_choose_backend(void *key, bool v6, const struct lb4_service *svc,
					       __u64 client, __u8 client_kind, __u32 maglev_id,
					       __u32 *backend_id)
{
	struct lb4_affinity_key akey4 = {
		.client = client,
		.svc_id = svc->svc_id,
		.client_kind = client_kind,
	};
	struct lb6_affinity_key akey6 = {
		.client = { client, 0 },
		.svc_id = svc->svc_id,
		.client_kind = client_kind,
	};

	if (!svc->affinity_timeout)
		return lb_new_backend(key, v6, svc, maglev_id, backend_id);
	return lb_affine_backend(key, v6, svc, v6 ? (const void *)&akey6 : (const void *)&akey4,
				 maglev_id, backend_id);
}

#endif /* EBPF_PROXY_LB_H */
