// SPDX-License-Identifier: Apache-2.0
// Meshwork socket-LB: cgroup sock_addr programs that translate a service's frontend (VIP and
// port) to one of its backends when a socket connects or sends (connect4, sendmsg4), and the
// backend back to the frontend when the socket reads its peer (recvmsg4, getpeername4), as
// Cilium's bpf_sock.c does. They read the lb4 maps the agent writes (lb4.h) and count each
// translation and refusal (meshwork_sock_lb_stats); attached to the node's cgroup2 root, with
// their links pinned, so translation goes on while the agent is down.

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/errno.h>
#include <bpf/bpf_helpers.h>

#include "lb4.h"

#define SYS_REJECT 0
#define SYS_PROCEED 1

// The context's protocol, read as the 4-byte field it is: a narrower load some compilers
// would emit is refused by the verifier (Cilium reads it the same way).
static __always_inline __u8 protocol_of(struct bpf_sock_addr *ctx)
{
	volatile __u32 protocol = ctx->protocol;

	return (__u8)protocol;
}

// One more of `what` (SOCK_LB_*) on this CPU: no atomics needed, the agent sums the CPUs.
static __always_inline void count(__u32 what)
{
	__u64 *n = bpf_map_lookup_elem(&meshwork_sock_lb_stats, &what);

	if (n)
		*n += 1;
}

// The frontend's master, backend slot and backend for `ctx`'s destination: 0 and `*out` set,
// 1 when the destination is no service, or an error the caller rejects with.
static __always_inline int pick_backend(struct bpf_sock_addr *ctx, struct lb4_key *key,
					 struct lb4_service **master, struct lb4_backend **out)
{
	struct lb4_service *svc, *slot;
	__u32 pick;

	key->address = ctx->user_ip4;
	key->dport = (__be16)ctx->user_port;
	key->backend_slot = 0;
	key->proto = protocol_of(ctx);
	key->scope = 0;
	svc = bpf_map_lookup_elem(&cilium_lb4_services_v2, key);
	if (!svc)
		return 1;
	if (svc->count == 0)
		return -EHOSTUNREACH;
	// Cilium's choice: random per TCP connection, by socket for UDP (a flow stays put).
	if (key->proto == IPPROTO_TCP)
		pick = bpf_get_prandom_u32();
	else
		pick = (__u32)bpf_get_socket_cookie(ctx);
	key->backend_slot = (__u16)(pick % svc->count) + 1;
	slot = bpf_map_lookup_elem(&cilium_lb4_services_v2, key);
	key->backend_slot = 0;
	if (!slot)
		return -EHOSTUNREACH;
	*out = bpf_map_lookup_elem(&cilium_lb4_backends_v3, &slot->backend_id);
	if (!*out)
		return -EHOSTUNREACH;
	*master = svc;
	return 0;
}

static __always_inline int xlate_fwd(struct bpf_sock_addr *ctx)
{
	struct lb4_key key = {};
	struct lb4_service *svc = 0;
	struct lb4_backend *backend = 0;
	struct ipv4_revnat_tuple rkey = {};
	struct ipv4_revnat_entry rval = {};
	struct ipv4_revnat_entry *known;
	int err = pick_backend(ctx, &key, &svc, &backend);

	if (err)
		return err;
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = backend->address;
	rkey.port = backend->port;
	rval.address = key.address;
	rval.port = key.dport;
	rval.rev_nat_index = svc->rev_nat_index;
	// A UDP socket sends many datagrams to one backend: write the record only when it changes.
	known = bpf_map_lookup_elem(&cilium_lb4_reverse_sk, &rkey);
	if (!known || known->address != rval.address || known->port != rval.port ||
	    known->rev_nat_index != rval.rev_nat_index) {
		if (bpf_map_update_elem(&cilium_lb4_reverse_sk, &rkey, &rval, BPF_ANY) < 0)
			return -ENOMEM;
	}
	ctx->user_ip4 = backend->address;
	ctx->user_port = (__u32)backend->port;
	return 0;
}

// 0: translated; 1: the destination is no service; negative: refused with that error.
static __always_inline int forward(struct bpf_sock_addr *ctx, __u32 hook)
{
	int err = xlate_fwd(ctx);

	if (err == 0) {
		count(hook);
	} else if (err == -EHOSTUNREACH || err == -ENOMEM) {
		count(SOCK_LB_REFUSED);
		bpf_set_retval(err);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

// The peer a socket reads back is the frontend it asked for, while that service still holds
// backends under the same rev-NAT index; otherwise the record is stale and goes. Counted as
// `hook` when translated.
static __always_inline void xlate_rev(struct bpf_sock_addr *ctx, __u32 hook)
{
	struct ipv4_revnat_tuple rkey = {};
	struct ipv4_revnat_entry *rval;
	struct lb4_key key = {};
	struct lb4_service *svc;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.address = ctx->user_ip4;
	rkey.port = (__be16)ctx->user_port;
	rval = bpf_map_lookup_elem(&cilium_lb4_reverse_sk, &rkey);
	if (!rval)
		return;
	key.address = rval->address;
	key.dport = rval->port;
	key.proto = protocol_of(ctx);
	svc = bpf_map_lookup_elem(&cilium_lb4_services_v2, &key);
	if (!svc || svc->rev_nat_index != rval->rev_nat_index || svc->count == 0) {
		bpf_map_delete_elem(&cilium_lb4_reverse_sk, &rkey);
		return;
	}
	ctx->user_ip4 = rval->address;
	ctx->user_port = (__u32)rval->port;
	count(hook);
}

SEC("cgroup/connect4")
int cil_sock4_connect(struct bpf_sock_addr *ctx)
{
	return forward(ctx, SOCK_LB_CONNECT4);
}

SEC("cgroup/sendmsg4")
int cil_sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	return forward(ctx, SOCK_LB_SENDMSG4);
}

SEC("cgroup/recvmsg4")
int cil_sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	xlate_rev(ctx, SOCK_LB_RECVMSG4);
	return SYS_PROCEED;
}

SEC("cgroup/getpeername4")
int cil_sock4_getpeername(struct bpf_sock_addr *ctx)
{
	xlate_rev(ctx, SOCK_LB_GETPEERNAME4);
	return SYS_PROCEED;
}

char _license[] SEC("license") = "GPL";
