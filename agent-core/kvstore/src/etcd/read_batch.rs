//! Key reads of many callers on one connection, sent together.
//!
//! An agent behind kvstoremesh starts 250 remote-cluster loops at once, all on the one local
//! etcd, and each first reads its cluster config, the heartbeat and its canaries in a
//! transaction of its own: 250 transactions, at about 0.4 ms of etcd's CPU each (a tenth of
//! what etcd spends on such an agent's whole sync). Gathered they are four.
//!
//! A read that finds the batcher idle is sent at once, alone. Reads that arrive while a
//! transaction is in flight wait for it, and then go together: in transactions of at most
//! [`MAX_OPS`] operations (etcd's default `--max-txn-ops`), a key that several ask for read
//! once. Each caller's keys and list are in one transaction, so at one revision, as when read
//! alone. A transaction etcd refuses (one caller asked for a key its user may not read, or
//! the server allows fewer operations) is sent again read by read, so that each caller gets
//! its own answer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::{GetOptions, KvClient, Txn, TxnOp, TxnOpResponse};
use tokio::sync::oneshot;

use super::{ListPage, TxnRead, with_deadline};
use crate::KvstoreError;
use crate::keys::prefix_range_end;

/// Operations per transaction: etcd's default `--max-txn-ops`.
const MAX_OPS: usize = 128;

/// One caller's read: keys, and optionally a prefix with the most keys to list.
#[derive(Debug, Clone)]
pub(super) struct Read {
    pub keys: Vec<String>,
    pub list: Option<(String, i64)>,
}

struct Pending {
    read: Read,
    reply: oneshot::Sender<Result<TxnRead, KvstoreError>>,
}

#[derive(Default)]
struct State {
    /// A task is sending what is queued.
    sending: bool,
    queue: Vec<Pending>,
}

/// The reads waiting on one connection; see the module docs.
#[derive(Default)]
pub(super) struct ReadBatcher {
    state: Mutex<State>,
}

impl ReadBatcher {
    /// `read` through `kv`, together with whatever else is waiting.
    pub(super) async fn read(
        self: &Arc<Self>,
        kv: &KvClient,
        read: Read,
    ) -> Result<TxnRead, KvstoreError> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.queue.push(Pending {
                read: read.clone(),
                reply,
            });
            !std::mem::replace(&mut state.sending, true)
        };
        if start {
            // A task of its own: a caller that gives up must not strand the others' reads.
            tokio::spawn(Arc::clone(self).send_queued(kv.clone()));
        }
        match answer.await {
            Ok(result) => result,
            // The sending task is gone (its runtime is shutting down): read alone.
            Err(_) => one_txn(kv, std::slice::from_ref(&read))
                .await
                .map(|mut reads| reads.remove(0)),
        }
    }

    async fn send_queued(self: Arc<Self>, kv: KvClient) {
        loop {
            let batch = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if state.queue.is_empty() {
                    state.sending = false;
                    return;
                }
                std::mem::take(&mut state.queue)
            };
            let sends = groups(batch)
                .into_iter()
                .map(|group| send_group(&kv, group));
            futures::future::join_all(sends).await;
        }
    }
}

/// `batch` cut into groups of at most [`MAX_OPS`] operations, keys shared within a group
/// counted once; every read is in one group.
fn groups(batch: Vec<Pending>) -> Vec<Vec<Pending>> {
    let mut groups = Vec::new();
    let mut group: Vec<Pending> = Vec::new();
    let mut keys: HashSet<String> = HashSet::new();
    let mut ops = 0;
    for pending in batch {
        let read = &pending.read;
        let new_keys = read.keys.iter().filter(|key| !keys.contains(*key)).count();
        let needs = new_keys + usize::from(read.list.is_some());
        if !group.is_empty() && ops + needs > MAX_OPS {
            groups.push(std::mem::take(&mut group));
            keys.clear();
            ops = 0;
        }
        for key in &read.keys {
            ops += usize::from(keys.insert(key.clone()));
        }
        ops += usize::from(read.list.is_some());
        group.push(pending);
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// One transaction for `group`; if etcd refuses it, one for each read.
async fn send_group(kv: &KvClient, group: Vec<Pending>) {
    let (reads, replies): (Vec<Read>, Vec<_>) =
        group.into_iter().map(|p| (p.read, p.reply)).unzip();
    match one_txn(kv, &reads).await {
        Ok(answers) => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                // A caller that gave up no longer listens.
                let _ = reply.send(Ok(answer));
            }
        }
        Err(_) if reads.len() > 1 => {
            let alone = reads.iter().zip(replies).map(|(read, reply)| async move {
                let answer = one_txn(kv, std::slice::from_ref(read)).await;
                let _ = reply.send(answer.map(|mut reads| reads.remove(0)));
            });
            futures::future::join_all(alone).await;
        }
        Err(err) => {
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(Err(err));
            }
        }
    }
}

/// `reads` in one transaction, each key read once: each read's answer, in order, all at the
/// transaction's revision.
pub(super) async fn one_txn(kv: &KvClient, reads: &[Read]) -> Result<Vec<TxnRead>, KvstoreError> {
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut ops = Vec::new();
    for key in reads.iter().flat_map(|read| &read.keys) {
        at.entry(key.as_str()).or_insert_with(|| {
            ops.push(TxnOp::get(key.as_str(), None));
            ops.len() - 1
        });
    }
    let mut list_at = Vec::with_capacity(reads.len());
    for read in reads {
        list_at.push(read.list.as_ref().map(|(prefix, limit)| {
            let options = GetOptions::new()
                .with_range(prefix_range_end(prefix.as_bytes()))
                .with_limit((*limit).max(1));
            ops.push(TxnOp::get(prefix.as_str(), Some(options)));
            ops.len() - 1
        }));
    }
    let response = with_deadline("get txn", kv.clone().txn(Txn::new().and_then(ops))).await?;
    let revision = response.header().map_or(0, |h| h.revision());
    let gets: Vec<_> = response
        .op_responses()
        .into_iter()
        .map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        })
        .collect();
    let answers = reads
        .iter()
        .zip(list_at)
        .map(|(read, list_at)| {
            let values = read
                .keys
                .iter()
                .map(|key| {
                    let get = gets.get(at[key.as_str()])?.as_ref()?;
                    get.kvs().first().map(|kv| kv.value().to_vec())
                })
                .collect();
            let listed = list_at.and_then(|i| gets.get(i)?.as_ref()).and_then(|get| {
                (!get.more()).then(|| ListPage::from_key_values(get.kvs(), revision, get.count()))
            });
            TxnRead {
                values,
                listed,
                revision,
            }
        })
        .collect();
    Ok(answers)
}
