// SPDX-License-Identifier: Apache-2.0
// Cilium's lb4 maps, shared by the endpoint object (which creates them, pinned by name, when it
// loads) and the socket-LB programs (which read them), and the socket-LB counters. Keep in step
// with services.rs.

#ifndef MESHWORK_LB4_H
#define MESHWORK_LB4_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define LB_MAP_ENTRIES 65536

// cilium_lb4_services_v2: slot 0 of a frontend is the master (count), slots 1..count the backends.
struct lb4_key {
	__be32 address;
	__be16 dport;
	__u16 backend_slot;
	__u8 proto;
	__u8 scope;
	__u8 pad[2];
};

struct lb4_service {
	__u32 backend_id;
	__u16 count;
	__be16 rev_nat_index;
	__u8 flags;
	__u8 flags2;
	__u8 pad[2];
};

// cilium_lb4_backends_v3: backend ID -> backend.
struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 flags;
	__u16 cluster_id;
	__u8 zone;
	__u8 pad;
};

// cilium_lb4_reverse_nat: rev-NAT index (the service ID) -> the frontend; Cilium packs it.
struct lb4_reverse_nat {
	__be32 address;
	__be16 port;
} __attribute__((packed));

// cilium_lb4_reverse_sk: what a socket was connected to, by cookie and backend.
struct ipv4_revnat_tuple {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct ipv4_revnat_entry {
	__be32 address;
	__be16 port;
	__be16 rev_nat_index;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(max_entries, LB_MAP_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_services_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb4_backend);
	__uint(max_entries, LB_MAP_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_backends_v3 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __be16);
	__type(value, struct lb4_reverse_nat);
	__uint(max_entries, LB_MAP_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_reverse_nat SEC(".maps");

// LRU: entries of closed sockets age out.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ipv4_revnat_tuple);
	__type(value, struct ipv4_revnat_entry);
	__uint(max_entries, LB_MAP_ENTRIES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} cilium_lb4_reverse_sk SEC(".maps");

// Meshwork's own (Cilium has none): what the socket-LB programs did, per CPU, pinned so the
// counts go on across agent restarts as the programs do. Keep in step with socket_lb_stats.rs.
#define SOCK_LB_CONNECT4 0
#define SOCK_LB_SENDMSG4 1
#define SOCK_LB_RECVMSG4 2
#define SOCK_LB_GETPEERNAME4 3
#define SOCK_LB_REFUSED 4
#define SOCK_LB_STATS_MAX 8

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SOCK_LB_STATS_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} meshwork_sock_lb_stats SEC(".maps");

#endif
