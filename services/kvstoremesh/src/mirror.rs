//! From a remote's store to the cache writer: [`Validated`] decodes every value with the
//! agent's decoder and keeps the remote's bytes, and [`CacheMirror`] turns the store's
//! changes into [`CacheOp`]s, one message per store batch.

use std::sync::Arc;

use meshwork_kvstore::{DecodeError, Decoder, Observer};
use meshwork_types::Resource;
use tokio::sync::mpsc;

use crate::keys::{CacheOp, KeySet};

/// A remote's value that passed the agent's validation, byte for byte.
pub type RawValue = Vec<u8>;

/// The agent's decoder `D`, used as a gate: a value is kept (as the remote wrote it) only
/// when `D` accepts it, so a hostile entry is counted by the store and never cached.
pub struct Validated<D>(pub D);

impl<D: Decoder> Decoder for Validated<D> {
    type Value = RawValue;

    fn decode(&self, key: &str, value: &[u8]) -> Result<RawValue, DecodeError> {
        self.0.decode(key, value)?;
        Ok(value.to_vec())
    }
}

/// Where the stores of every remote send their batches.
pub type OpSender = mpsc::UnboundedSender<Vec<CacheOp>>;

/// The observer of one remote store: cache keys are the store's relative keys below the
/// cache prefix of the remote and kind.
pub struct CacheMirror {
    cluster: Arc<str>,
    kind: Resource,
    prefix: String,
    ops: Vec<CacheOp>,
    /// The cache keys of the first list, until it is done.
    listed: Option<KeySet>,
    sender: OpSender,
}

impl CacheMirror {
    /// A mirror of `cluster`'s `kind` into `prefix` (ending in `/`), sending to `sender`.
    pub fn new(cluster: Arc<str>, kind: Resource, prefix: String, sender: OpSender) -> Self {
        Self {
            cluster,
            kind,
            prefix,
            ops: Vec::new(),
            listed: Some(KeySet::default()),
            sender,
        }
    }

    fn cache_key(&self, key: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + key.len());
        out.push_str(&self.prefix);
        out.push_str(key);
        out
    }
}

impl Observer<RawValue> for CacheMirror {
    fn on_upsert(&mut self, key: &str, value: &Arc<RawValue>) {
        let key = self.cache_key(key);
        if let Some(listed) = &mut self.listed {
            listed.insert(key.clone());
        }
        self.ops.push(CacheOp::Put {
            key,
            value: value.as_ref().clone(),
        });
    }

    fn on_delete(&mut self, key: &str, _value: &Arc<RawValue>) {
        let key = self.cache_key(key);
        if let Some(listed) = &mut self.listed {
            listed.remove(&key);
        }
        self.ops.push(CacheOp::Delete { key });
    }

    fn on_list_done(&mut self) {
        self.ops.push(CacheOp::ListDone {
            cluster: Arc::clone(&self.cluster),
            kind: self.kind,
            prefix: self.prefix.clone(),
            listed: self.listed.take().unwrap_or_default(),
        });
    }

    fn flush(&mut self) {
        if self.ops.is_empty() {
            return;
        }
        // The writer gone means kvstoremesh is stopping: nothing is left to mirror to.
        let _ = self.sender.send(std::mem::take(&mut self.ops));
    }
}

#[cfg(test)]
mod tests {
    use meshwork_types::NodeDecoder;

    use super::*;

    #[test]
    fn only_values_the_agent_accepts_pass_and_they_pass_unchanged() {
        let decoder = Validated(NodeDecoder::new("c1", Some(1)));
        let good = br#"{"name":"n1","cluster":"c1","clusterID":1}"#;
        assert_eq!(decoder.decode("n1", good).unwrap(), good.to_vec());
        let other_cluster = br#"{"name":"n1","cluster":"c2","clusterID":2}"#;
        assert!(decoder.decode("n1", other_cluster).is_err());
        assert!(decoder.decode("n1", b"{not json").is_err());
    }

    #[test]
    fn the_first_list_carries_its_keys_and_later_changes_do_not() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut mirror = CacheMirror::new(
            "c1".into(),
            Resource::Nodes,
            "cilium/cache/nodes/v1/c1/".into(),
            tx,
        );
        let value = Arc::new(b"v".to_vec());
        mirror.on_upsert("n1", &value);
        mirror.on_upsert("n2", &value);
        mirror.on_delete("n2", &value);
        mirror.on_list_done();
        mirror.flush();
        mirror.on_upsert("n3", &value);
        mirror.flush();
        let first = rx.try_recv().unwrap();
        assert!(
            matches!(&first[0], CacheOp::Put { key, .. } if key == "cilium/cache/nodes/v1/c1/n1")
        );
        let CacheOp::ListDone { listed, .. } = &first[3] else {
            panic!("expected the list-done last, got {first:?}");
        };
        assert_eq!(listed.len(), 1);
        assert!(listed.contains("cilium/cache/nodes/v1/c1/n1"));
        let later = rx.try_recv().unwrap();
        assert!(matches!(&later[..], [CacheOp::Put { key, .. }] if key.ends_with("/n3")));
    }
}
