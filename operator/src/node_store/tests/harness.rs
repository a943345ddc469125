//! The invariant harness's moving parts: an allocator-like [`drive`]r that attaches ENIs
//! and assigns addresses in the shared describe cache, a [`publish_loop`] publishing the
//! node being allocated meanwhile, and [`Observed`], the tally an observer keeps of every
//! published version.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::cilium_node::{CiliumNode, CiliumNodeSpec};
use crate::instances::InstanceCache;
use crate::model::Eni;
use crate::node_allocator::NodeSpec;
use crate::node_store::{LiveNode, NodeStore};

/// Driver steps per node: an ENI attached with two addresses, then one more address on it,
/// three times over. Small nodes keep every published object small, so the run reaches
/// many versions quickly.
const STEPS_PER_NODE: usize = 6;

/// State shared by driver, publisher and observer.
#[derive(Debug, Default)]
pub struct Shared {
    /// The describe cache the driver changes and the publisher reads.
    pub cache: Arc<RwLock<InstanceCache>>,
    /// The node the driver is working on.
    pub node: AtomicUsize,
    /// Publishes completed.
    pub published: AtomicUsize,
    /// Set to stop driver and publisher.
    pub stop: AtomicBool,
    /// What the observer saw.
    pub observed: Observed,
}

/// Every published version, counted and checked.
#[derive(Debug, Default)]
pub struct Observed {
    versions: AtomicUsize,
    first_violation: Mutex<Option<String>>,
}

impl Observed {
    /// Checks one published version: every pool IP's ENI must be in its status.
    pub fn record(&self, node: &CiliumNode) {
        self.versions.fetch_add(1, Ordering::SeqCst);
        let missing = node.pool_ips_without_eni();
        if let Some((ip, eni)) = missing.first() {
            let mut first = self
                .first_violation
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            first.get_or_insert_with(|| {
                format!(
                    "{} v{}: pool IP {ip} names {eni}, not in status ({} such IPs)",
                    node.metadata.name.as_deref().unwrap_or("?"),
                    node.metadata.resource_version.as_deref().unwrap_or("?"),
                    missing.len()
                )
            });
        }
    }

    /// Versions seen.
    pub fn versions(&self) -> usize {
        self.versions.load(Ordering::SeqCst)
    }

    /// The first violation seen, if any.
    pub fn first_violation(&self) -> Option<String> {
        self.first_violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// True once a violation was seen.
    pub fn violated(&self) -> bool {
        self.first_violation().is_some()
    }
}

fn node_name(index: usize) -> String {
    format!("node-{index}")
}

fn instance_id(index: usize) -> String {
    format!("i-{index}")
}

/// The allocator stand-in: one cache mutation per completed publish (so it neither runs
/// ahead through thousands of nodes nor falls behind), landing at whatever point of the
/// publisher's work it happens to — the two run on different threads. Moves to the next
/// node every [`STEPS_PER_NODE`] steps.
pub async fn drive(shared: Arc<Shared>) {
    let mut next_address = u32::from(Ipv4Addr::new(10, 213, 0, 1));
    let mut step = 0usize;
    let mut seen_publishes = 0usize;
    while !shared.stop.load(Ordering::SeqCst) {
        let published = shared.published.load(Ordering::SeqCst);
        if published == seen_publishes {
            tokio::task::yield_now().await;
            continue;
        }
        seen_publishes = published;
        let node = step / STEPS_PER_NODE;
        let within = step % STEPS_PER_NODE;
        let eni_id = format!("eni-{node}-{}", within / 2);
        let mut addresses = || {
            next_address += 1;
            Ipv4Addr::from(next_address)
        };
        {
            let mut cache = shared.cache.write().unwrap_or_else(PoisonError::into_inner);
            if within.is_multiple_of(2) {
                // Created with its addresses, as the allocator creates ENIs.
                let eni = Eni {
                    id: eni_id,
                    number: u32::try_from(within / 2).expect("small"),
                    addresses: vec![addresses(), addresses()],
                    ..Eni::default()
                };
                cache.upsert_eni(&instance_id(node), eni);
            } else {
                cache.add_addresses(&instance_id(node), &eni_id, &[addresses()]);
            }
        }
        step += 1;
        if step.is_multiple_of(STEPS_PER_NODE) {
            shared.node.store(step / STEPS_PER_NODE, Ordering::SeqCst);
        }
    }
}

/// Publishes the node the driver is on, again and again, until `shared.stop`. Returns the
/// number of publishes.
pub async fn publish_loop<S: NodeStore>(store: S, shared: Arc<Shared>) -> usize {
    let mut current: Option<(usize, LiveNode, CiliumNode)> = None;
    let mut publishes = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        let index = shared.node.load(Ordering::SeqCst);
        let (live, latest) = match current.take() {
            Some((at, live, latest)) if at == index => (live, latest),
            _ => {
                let name = node_name(index);
                let mut spec = NodeSpec::default();
                spec.name.clone_from(&name);
                spec.eni.instance_id = instance_id(index);
                let live = LiveNode::new(Arc::clone(&shared.cache), spec);
                let latest = store.get(&name).await.expect("get").unwrap_or_else(|| {
                    let mut spec = CiliumNodeSpec::default();
                    spec.eni.instance_id = instance_id(index);
                    CiliumNode::new(&name, spec)
                });
                (live, latest)
            }
        };
        let stored = store.publish(latest, &live).await.expect("publish");
        publishes += 1;
        shared.published.fetch_add(1, Ordering::SeqCst);
        current = Some((index, live, stored));
    }
    publishes
}
