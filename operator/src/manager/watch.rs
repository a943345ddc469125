//! Learning the nodes from the store: CiliumNode objects, listed then watched, as
//! [`NodeEvent`]s. Kubernetes through kube's watcher; etcd through the kvstore's restartable
//! [`WatchStore`] (paginated lists, TLS, deadlines, a re-list with backoff when the watch is
//! lost or compacted), each object carrying its key's mod revision as its `resourceVersion`
//! (the publish transaction is guarded by it, and the `NodeIpam` generation is it).

use std::collections::BTreeSet;
use std::sync::Arc;

use actix::Recipient;
use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use meshwork_kvstore::{
    DecodeError, Decoder, EtcdBackend, Observer, WatchStore, WatchStoreOptions,
};
use tokio_util::sync::CancellationToken;

use crate::cilium_node::CiliumNode;
use crate::node_store::KEY_PREFIX;

use super::node_actor::NodeEvent;

fn upsert(sink: &Recipient<NodeEvent>, node: CiliumNode) {
    sink.do_send(NodeEvent::Upsert(Box::new(node)));
}

/// Decodes the CiliumNode stored under a key of [`KEY_PREFIX`]; the key (relative to the
/// prefix) must be the object's name. Decoded with its revision ([`Decoder::decode_at`]), the
/// object carries the key's mod revision as its `resourceVersion`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CiliumNodeDecoder;

impl Decoder for CiliumNodeDecoder {
    type Value = CiliumNode;

    fn decode(&self, key: &str, value: &[u8]) -> Result<CiliumNode, DecodeError> {
        let mut node: CiliumNode = serde_json::from_slice(value)?;
        // A mismatch would make the key's delete miss the node it names.
        if node.metadata.name.as_deref() != Some(key) {
            return Err(DecodeError::Invalid(format!(
                "metadata.name {:?} is not the key's name",
                node.metadata.name
            )));
        }
        // Whatever a writer left here is not the key's revision.
        node.metadata.resource_version = None;
        Ok(node)
    }

    fn decode_at(
        &self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
    ) -> Result<CiliumNode, DecodeError> {
        let mut node = self.decode(key, value)?;
        node.metadata.resource_version = Some(mod_revision.to_string());
        Ok(node)
    }
}

/// The watch store's observer: sends every change to the node manager; once the manager is
/// gone, it ends the watch.
struct NodeSink {
    sink: Recipient<NodeEvent>,
    /// The names of the first list, until it is done.
    listing: Option<BTreeSet<String>>,
    cancel: CancellationToken,
}

impl NodeSink {
    fn send(&self, event: NodeEvent) {
        if self.sink.connected() {
            self.sink.do_send(event);
        } else {
            self.cancel.cancel();
        }
    }
}

impl Observer<CiliumNode> for NodeSink {
    fn on_upsert(&mut self, key: &str, node: &Arc<CiliumNode>) {
        if let Some(listing) = &mut self.listing {
            listing.insert(key.to_owned());
        }
        self.send(NodeEvent::Upsert(Box::new(CiliumNode::clone(node))));
    }

    fn on_delete(&mut self, key: &str, _: &Arc<CiliumNode>) {
        if let Some(listing) = &mut self.listing {
            listing.remove(key);
        }
        self.send(NodeEvent::Delete(key.to_owned()));
    }

    fn on_list_done(&mut self) {
        let names = self.listing.take().unwrap_or_default();
        self.send(NodeEvent::Listed(names));
    }
}

/// Watches `meshwork/ciliumnodes/v1/` in etcd through `backend` until the sink is gone
/// (noticed at the next change). `options` name the source and carry the kvstore metrics
/// (undecodable objects are logged, counted there and skipped).
pub async fn watch_etcd(
    backend: EtcdBackend,
    sink: Recipient<NodeEvent>,
    options: WatchStoreOptions,
) {
    let cancel = CancellationToken::new();
    let observer = NodeSink {
        sink,
        listing: Some(BTreeSet::new()),
        cancel: cancel.clone(),
    };
    let mut store = WatchStore::new(CiliumNodeDecoder, observer, options);
    store.watch(&backend, KEY_PREFIX, &cancel).await;
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
