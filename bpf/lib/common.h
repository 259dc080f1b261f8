/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Common includes, constants and small helpers for every ebpf-proxy program. */
#ifndef EBPF_PROXY_COMMON_H
#define EBPF_PROXY_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <linux/in.h>

/* Only the few errno values the programs use, so that no libc header is
 * needed. */
#define EPERM	     1
#define ENOMEM	     12
#define ETIMEDOUT    110
#define ECONNREFUSED 111
#define EHOSTUNREACH 113

/* AF_INET for bpf_fib_lookup, which the C library would define. */
#define PKT_AF_INET  2
#define PKT_AF_INET6 10

typedef _Bool bool;
#define true 1
#define false 0

/* Return values of cgroup sock_addr programs. */
#define SYS_REJECT  0
#define SYS_PROCEED 1

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#endif /* EBPF_PROXY_COMMON_H */
