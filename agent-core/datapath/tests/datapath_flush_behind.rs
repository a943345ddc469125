//! The map writer's flush thread on real pinned maps: batches without a list-done are written
//! behind the next batch's bookkeeping, and nothing that must see the map written does so
//! before it is.

use std::sync::Arc;

use meshwork_datapath::maps::PinDir;
use meshwork_datapath::writer::MapWriter;
use meshwork_lab::bpffs::BpfRoot;
use meshwork_types::{Change, IpCacheEntry, IpIdentityPair, RemoteEvent, Resource};

fn upserts(from: u32, count: u32) -> Vec<RemoteEvent> {
    (from..from + count)
        .map(|i| {
            let entry = IpCacheEntry::from_pair(IpIdentityPair {
                ip: Some(std::net::Ipv4Addr::from(0x0ad6_0000 + i).into()),
                id: 70_000 + i % 1000,
                ..IpIdentityPair::default()
            })
            .unwrap();
            RemoteEvent::IpCache {
                created: true,
                change: Change::Upsert(Arc::new(entry)),
            }
        })
        .collect()
}

fn list_done() -> Vec<RemoteEvent> {
    vec![RemoteEvent::ListDone(Resource::IpCache)]
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn a_list_done_returns_with_every_batch_before_it_in_the_map() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut writer = MapWriter::new(pins.recreate_ipcache().unwrap(), None);
    let cluster: Arc<str> = Arc::from("b");
    for batch in 0..20 {
        writer.apply_remote(&cluster, &upserts(batch * 1000, 1000));
    }
    // The last batch is large, so that a writer that did not wait would still be writing it.
    let mut last = upserts(20_000, 30_000);
    last.extend(list_done());
    writer.apply_remote(&cluster, &last);

    let held = pins.open_ipcache().unwrap().entries().unwrap().len();
    assert_eq!(
        held, 50_000,
        "every entry is in the map when the list-done returns"
    );
    let report = writer.report();
    assert_eq!(report.stats.written, 50_000);
    assert_eq!(report.entries, 50_000);
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn a_full_map_found_behind_is_reported_by_the_next_list_done() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut writer = MapWriter::new(pins.recreate_ipcache_sized(10).unwrap(), None);
    let cluster: Arc<str> = Arc::from("b");
    writer.apply_remote(&cluster, &upserts(0, 8));
    writer.apply_remote(&cluster, &upserts(8, 7));
    writer.apply_remote(&cluster, &list_done());

    let report = writer.report();
    assert_eq!(report.stats.written, 10);
    assert_eq!(report.stats.map_full, 5);
    assert_eq!(report.entries, 10, "what did not fit is no longer desired");
    let error = report.last_error.expect("the full map is reported");
    assert!(error.contains("full"), "{error}");
    assert_eq!(pins.open_ipcache().unwrap().entries().unwrap().len(), 10);
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn a_writer_dropped_with_a_batch_in_flight_writes_it_first() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut writer = MapWriter::new(pins.recreate_ipcache().unwrap(), None);
    writer.apply_remote(&Arc::from("b"), &upserts(0, 30_000));
    drop(writer);
    assert_eq!(
        pins.open_ipcache().unwrap().entries().unwrap().len(),
        30_000
    );
}

#[test]
#[ignore = "needs root and bpffs: `cargo xtask test` runs it"]
fn a_batch_written_behind_is_counted_once_done_without_another_batch() {
    let root = BpfRoot::new().unwrap();
    let pins = PinDir::under(root.path());
    let mut writer = MapWriter::new(pins.recreate_ipcache().unwrap(), None);
    let (done, flushed) = std::sync::mpsc::channel();
    // The receiver outlives the writer here; a failed send cannot happen.
    writer.on_flushed(move || {
        done.send(()).ok();
    });
    writer.apply_remote(&Arc::from("b"), &upserts(0, 5_000));
    flushed
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the flush thread says when the batch is written");
    assert_eq!(
        writer.report().stats.written,
        0,
        "counted only once collected"
    );
    writer.collect_flushed();
    let report = writer.report();
    assert_eq!(report.stats.written, 5_000);
}
