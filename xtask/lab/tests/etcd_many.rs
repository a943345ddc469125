//! Many lab etcds at once on a ramfs: each healthy on its own ports, their WAL segments
//! sparse (so hundreds fit), and the mount gone with its handle.

use std::collections::HashSet;

use meshwork_lab::etcd::{EtcdOptions, EtcdServer};
use meshwork_lab::ramfs::Ramfs;

/// etcd preallocates one 64 MB segment.
const WAL_SEGMENT: u64 = 64_000_000;

#[test]
#[ignore = "needs real etcd and root: `cargo xtask test` runs it"]
fn many_etcds_start_on_ramfs_with_sparse_wals_and_the_mount_goes() {
    let ramfs = Ramfs::mount().unwrap();
    let mount = ramfs.path().to_owned();
    let servers = EtcdServer::start_many((0..8).map(|i| EtcdOptions {
        name: Some(format!("many-{i}")),
        max_procs: Some(1),
        data_parent: Some(mount.clone()),
        ..EtcdOptions::default()
    }))
    .unwrap();
    let ports: HashSet<u16> = servers.iter().map(EtcdServer::client_port).collect();
    assert_eq!(ports.len(), 8, "one port each");
    for (i, server) in servers.iter().enumerate() {
        server.ctl(&["put", "k", &i.to_string()]).unwrap();
        assert_eq!(
            server
                .ctl(&["get", "k", "--print-value-only"])
                .unwrap()
                .trim(),
            i.to_string()
        );
        assert!(
            server.dir().starts_with(&mount),
            "{}",
            server.dir().display()
        );
    }
    let used = ramfs.used_bytes();
    assert!(
        used < WAL_SEGMENT,
        "8 servers hold {used} bytes: the WAL segments are not sparse"
    );
    drop(servers);
    drop(ramfs);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mount.to_str().unwrap()), "{mounts}");
    assert!(!mount.exists());
}
