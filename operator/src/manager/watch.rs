//! Learning the nodes from the store: CiliumNode objects, listed then watched, as
//! [`NodeEvent`]s. Kubernetes through kube's watcher; etcd by a prefix list and a watch from
//! the listed revision, re-listing when the watch is lost (e.g. compacted).

use std::collections::BTreeSet;
use std::time::Duration;

use actix::Recipient;
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::cilium_node::CiliumNode;
use crate::node_store::KEY_PREFIX;
use crate::node_store::etcd::decode;

use super::node_actor::NodeEvent;

/// Wait before re-listing after an etcd failure.
const RELIST_BACKOFF: Duration = Duration::from_secs(1);

fn upsert(sink: &Recipient<NodeEvent>, node: CiliumNode) {
    sink.do_send(NodeEvent::Upsert(Box::new(node)));
}

/// Watches `meshwork/ciliumnodes/v1/` in etcd until the sink is gone.
pub async fn watch_etcd(client: Client, sink: Recipient<NodeEvent>) {
    while sink.connected() {
        if let Err(err) = list_and_watch(client.clone(), &sink).await {
            tracing::warn!(%err, "CiliumNode watch on etcd lost; re-listing");
            // Backoff before reconnecting, not synchronisation.
            tokio::time::sleep(RELIST_BACKOFF).await;
        }
    }
}

async fn list_and_watch(
    mut client: Client,
    sink: &Recipient<NodeEvent>,
) -> Result<(), etcd_client::Error> {
    let listed = client
        .get(KEY_PREFIX, Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = listed.header().map_or(0, |header| header.revision());
    let mut names = BTreeSet::new();
    for kv in listed.kvs() {
        match decode(kv) {
            Ok(node) => {
                if let Some(name) = &node.metadata.name {
                    names.insert(name.clone());
                }
                upsert(sink, node);
            }
            Err(err) => tracing::warn!(%err, "skipping an undecodable CiliumNode"),
        }
    }
    sink.do_send(NodeEvent::Listed(names));
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let mut stream = client.watch(KEY_PREFIX, Some(options)).await?;
    while let Some(message) = stream.message().await? {
        if message.canceled() {
            tracing::info!(reason = message.cancel_reason(), "etcd cancelled the watch");
            return Ok(());
        }
        for event in message.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => match decode(kv) {
                    Ok(node) => upsert(sink, node),
                    Err(err) => tracing::warn!(%err, "skipping an undecodable CiliumNode"),
                },
                EventType::Delete => {
                    let key = String::from_utf8_lossy(kv.key());
                    if let Some(name) = key.strip_prefix(KEY_PREFIX) {
                        sink.do_send(NodeEvent::Delete(name.to_owned()));
                    }
                }
            }
        }
        if !sink.connected() {
            return Ok(());
        }
    }
    Ok(())
}

/// Watches CiliumNode objects in Kubernetes until the sink is gone (kube's watcher
/// re-lists and backs off by itself).
pub async fn watch_kube(api: Api<CiliumNode>, sink: Recipient<NodeEvent>) {
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing = BTreeSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(node)) => upsert(&sink, node),
            Ok(Event::Delete(node)) => {
                if let Some(name) = node.metadata.name {
                    sink.do_send(NodeEvent::Delete(name));
                }
            }
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(node)) => {
                if let Some(name) = &node.metadata.name {
                    listing.insert(name.clone());
                }
                upsert(&sink, node);
            }
            Ok(Event::InitDone) => sink.do_send(NodeEvent::Listed(std::mem::take(&mut listing))),
            Err(err) => tracing::warn!(%err, "CiliumNode watch on Kubernetes failed; retrying"),
        }
        if !sink.connected() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
