// SPDX-License-Identifier: Apache-2.0
// Meshwork endpoint program: TC classifier on the host side of a pod's veth (ingress = packets
// leaving the pod). Looks the destination up in cilium_ipcache, enforces the endpoint's allowed
// destination identities, counts drops by reason and passes the rest.
//
// Rust stable has no BPF target here, so this is C built by agent-core's build script with clang.
// aya 0.14 loads TC programs from SEC("classifier").

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ENDPOINT_FAMILY_IPV4 1
#define ENDPOINT_FAMILY_IPV6 2
// Bits of the key after prefixlen that precede the IP: pad (16), cluster_id (8), family (8).
#define IPCACHE_STATIC_PREFIX 32

// Keep in step with agent-core/src/datapath/drops.rs.
#define DROP_UNKNOWN_DESTINATION 1
#define DROP_POLICY_DENIED 2
#define DROP_MALFORMED 3
#define DROP_REASON_MAX 8

// Cilium's ipcache key: 24 bytes.
struct ipcache_key {
	__u32 prefixlen;
	__u16 pad1;
	__u8 cluster_id;
	__u8 family;
	union {
		__u32 ip4;
		__u32 ip6[4];
	};
};

// Cilium's ipcache value: 12 bytes.
struct remote_endpoint_info {
	__u32 sec_identity;
	__u32 tunnel_endpoint;
	__u16 pad;
	__u8 key;
	__u8 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct remote_endpoint_info);
	__uint(max_entries, 512000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_ipcache SEC(".maps");

// Allowed destination identities of this endpoint: one map per loaded program.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 1024);
} meshwork_policy SEC(".maps");

// Drops by reason, shared by every endpoint and kept across agent restarts.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, DROP_REASON_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} meshwork_drops SEC(".maps");

// Maps the agent owns and this program does not read; declared here so every map's shape is
// defined once and created (pinned by name) when the object loads. The lb4 maps are the
// socket-LB programs' (sock_lb.c); the tunnel map is declared below.
#include "lb4.h"

// Cilium's tunnel map: a remote pod CIDR's network address -> the node hosting it.
struct tunnel_key {
	union {
		__u32 ip4;
		__u32 ip6[4];
	};
	__u8 family;
	__u8 pad;
	__u16 cluster_id;
};

struct tunnel_value {
	union {
		__u32 ip4;
		__u32 ip6[4];
	};
	__u8 family;
	__u8 key;
	__u16 node_id;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct tunnel_key);
	__type(value, struct tunnel_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_tunnel_map SEC(".maps");

static __always_inline int drop(__u32 reason)
{
	__u64 *count = bpf_map_lookup_elem(&meshwork_drops, &reason);

	if (count)
		*count += 1;
	return TC_ACT_SHOT;
}

static __always_inline int enforce(struct ipcache_key *key)
{
	struct remote_endpoint_info *info = bpf_map_lookup_elem(&cilium_ipcache, key);

	if (!info)
		return drop(DROP_UNKNOWN_DESTINATION);
	if (!bpf_map_lookup_elem(&meshwork_policy, &info->sec_identity))
		return drop(DROP_POLICY_DENIED);
	return TC_ACT_OK;
}

SEC("classifier")
int meshwork_endpoint(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipcache_key key = {};

	if ((void *)(eth + 1) > data_end)
		return TC_ACT_OK;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);

		if ((void *)(ip4 + 1) > data_end)
			return drop(DROP_MALFORMED);
		key.prefixlen = IPCACHE_STATIC_PREFIX + 32;
		key.family = ENDPOINT_FAMILY_IPV4;
		key.ip4 = ip4->daddr;
		return enforce(&key);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		__u8 first;

		if ((void *)(ip6 + 1) > data_end)
			return drop(DROP_MALFORMED);
		first = ip6->daddr.in6_u.u6_addr8[0];
		// Neighbour discovery and other link-local or multicast traffic stays on the link.
		if (first == 0xff || (first == 0xfe && (ip6->daddr.in6_u.u6_addr8[1] & 0xc0) == 0x80))
			return TC_ACT_OK;
		key.prefixlen = IPCACHE_STATIC_PREFIX + 128;
		key.family = ENDPOINT_FAMILY_IPV6;
		__builtin_memcpy(key.ip6, &ip6->daddr, 16);
		return enforce(&key);
	}
	// ARP and everything else that is not IP.
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
