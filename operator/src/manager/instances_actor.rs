//! The `InstancesManager` actor: a thin shell over [`super::resync`] that owns the resync
//! schedule and the ENI garbage collection, and tells the node manager when the cache is
//! fresh.

use std::time::{Duration, Instant};

use actix::prelude::*;

use crate::ec2::Ec2;
use crate::instances::{CacheAccess, SharedCache};
use crate::model::Tags;

use super::resync::{
    EniGc, RESYNC_INTERVAL, ResyncDecision, ResyncFilter, ResyncScheduler, resync,
};

/// Garbage collection of leaked ENIs, by default every five minutes (as Cilium).
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(300);

/// Ask for a resync (after mutations); coalesced and spaced.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Resync;

/// Sent to the subscriber after every resync.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct CacheSynced {
    /// False if the describe failed (the previous cache was kept).
    pub ok: bool,
}

/// Settings of the instances manager.
#[derive(Debug, Clone)]
pub struct InstancesConfig {
    /// What to describe.
    pub filter: ResyncFilter,
    /// The periodic refresh.
    pub interval: Duration,
    /// `--eni-tags`: what marks the ENIs this operator created (GC only collects those).
    pub eni_tags: Tags,
    /// How often leaked ENIs are collected.
    pub gc_interval: Duration,
}

impl Default for InstancesConfig {
    fn default() -> Self {
        Self {
            filter: ResyncFilter::default(),
            interval: RESYNC_INTERVAL,
            eni_tags: Tags::new(),
            gc_interval: DEFAULT_GC_INTERVAL,
        }
    }
}

/// The actor.
pub struct InstancesManager {
    ec2: Ec2,
    cache: SharedCache,
    config: InstancesConfig,
    scheduler: ResyncScheduler,
    gc: EniGc,
    subscriber: Option<Recipient<CacheSynced>>,
}

impl InstancesManager {
    /// Refreshes `cache` through `ec2`, telling `subscriber` after each resync.
    pub fn new(
        ec2: Ec2,
        cache: SharedCache,
        config: InstancesConfig,
        subscriber: Option<Recipient<CacheSynced>>,
    ) -> Self {
        Self {
            ec2,
            cache,
            config,
            scheduler: ResyncScheduler::default(),
            gc: EniGc::default(),
            subscriber,
        }
    }

    fn decide(&mut self, decision: ResyncDecision, ctx: &mut Context<Self>) {
        match decision {
            ResyncDecision::Start => self.start(ctx),
            ResyncDecision::At(at) => {
                let delay = at.saturating_duration_since(Instant::now());
                ctx.run_later(delay, |act, ctx| {
                    let decision = act.scheduler.timer_fired(Instant::now());
                    act.decide(decision, ctx);
                });
            }
            ResyncDecision::Wait => {}
        }
    }

    fn start(&mut self, ctx: &mut Context<Self>) {
        let (ec2, cache, filter) = (
            self.ec2.clone(),
            self.cache.clone(),
            self.config.filter.clone(),
        );
        let work = async move { resync(&ec2, &cache, &filter).await };
        ctx.spawn(work.into_actor(self).map(|result, act, ctx| {
            let ok = match result {
                Ok(()) => true,
                Err(err) => {
                    tracing::warn!(%err, "resync failed");
                    false
                }
            };
            if ok {
                act.collect_garbage(ctx);
            }
            if let Some(subscriber) = &act.subscriber {
                subscriber.do_send(CacheSynced { ok });
            }
            let decision = act.scheduler.finished(Instant::now());
            act.decide(decision, ctx);
        }));
    }

    fn collect_garbage(&mut self, ctx: &mut Context<Self>) {
        let unattached = self.cache.clone().with(|c| c.unattached().to_vec());
        let leaked = self.gc.collect(
            Instant::now(),
            self.config.gc_interval,
            &unattached,
            &self.config.eni_tags,
        );
        if leaked.is_empty() {
            return;
        }
        let (ec2, mut cache) = (self.ec2.clone(), self.cache.clone());
        ctx.spawn(
            async move {
                for eni_id in leaked {
                    match ec2.delete_network_interface(&eni_id).await {
                        Ok(()) => {
                            tracing::info!(eni = %eni_id, "deleted a leaked ENI");
                            cache.with(|c| c.forget_unattached(&eni_id));
                        }
                        Err(err) => tracing::warn!(eni = %eni_id, %err, "deleting a leaked ENI"),
                    }
                }
            }
            .into_actor(self),
        );
    }
}

impl Actor for InstancesManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let decision = self.scheduler.request(Instant::now());
        self.decide(decision, ctx);
        ctx.run_interval(self.config.interval, |act, ctx| {
            let decision = act.scheduler.request(Instant::now());
            act.decide(decision, ctx);
        });
    }
}

impl Handler<Resync> for InstancesManager {
    type Result = ();

    fn handle(&mut self, _: Resync, ctx: &mut Context<Self>) {
        let decision = self.scheduler.request(Instant::now());
        self.decide(decision, ctx);
    }
}
