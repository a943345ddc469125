//! The restart timeline in the API's shape (`meshwork.agent.v1.TimelineResponse`).

use meshwork_proto::agent::v1 as pb;
use meshwork_types::{Resource, SyncKind};

use crate::timeline::{Step, Timeline, WaitEnd, Waiter};

/// The whole timeline.
pub fn timeline_response(timeline: &Timeline) -> pb::TimelineResponse {
    pb::TimelineResponse {
        started_at: humantime::format_rfc3339_millis(timeline.started_at()).to_string(),
        steps: timeline
            .entries()
            .iter()
            .map(|entry| {
                let mut step = timeline_step(&entry.step);
                step.offset_us = u64::try_from(entry.offset.as_micros()).unwrap_or(u64::MAX);
                step
            })
            .collect(),
        dropped: timeline.dropped(),
    }
}

/// One step (its offset left 0).
pub fn timeline_step(step: &Step) -> pb::TimelineStep {
    let mut out = pb::TimelineStep::default();
    match step {
        Step::Started => out.set_type(pb::StepType::Started),
        Step::Connected { cluster } => {
            out.set_type(pb::StepType::Connected);
            out.cluster = cluster.to_string();
        }
        Step::ListDone { cluster, resource } => {
            out.set_type(pb::StepType::ListDone);
            out.cluster = cluster.to_string();
            out.set_resource(resource_of(*resource));
        }
        Step::WaitReturned { waiter, kind, end } => {
            out.set_type(pb::StepType::WaitReturned);
            out.set_sync_kind(sync_kind_of(*kind));
            out.set_waiter(waiter_of(*waiter));
            let wait_end = match end {
                WaitEnd::Synced => pb::WaitEnd::Synced,
                WaitEnd::Breaker { pending } => {
                    out.pending.clone_from(pending);
                    pb::WaitEnd::Breaker
                }
                WaitEnd::Timeout => pb::WaitEnd::Timeout,
                WaitEnd::Failed(error) => {
                    out.error = Some(error.clone());
                    pb::WaitEnd::Failed
                }
            };
            out.set_wait_end(wait_end);
        }
        Step::EndpointRegenerated { endpoint, error } => {
            out.set_type(pb::StepType::EndpointRegenerated);
            out.endpoint_id = *endpoint;
            out.error.clone_from(error);
        }
        Step::WireguardGc { kind, removed } => {
            out.set_type(pb::StepType::WireguardGc);
            out.set_sync_kind(sync_kind_of(*kind));
            out.removed = *removed;
        }
        Step::Pruned { kind, removed } => {
            out.set_type(pb::StepType::Pruned);
            out.set_sync_kind(sync_kind_of(*kind));
            out.removed = *removed;
        }
    }
    out
}

fn resource_of(resource: Resource) -> pb::TimelineResource {
    match resource {
        Resource::Nodes => pb::TimelineResource::Nodes,
        Resource::Services => pb::TimelineResource::Services,
        Resource::Identities => pb::TimelineResource::Identities,
        Resource::IpCache => pb::TimelineResource::Ipcache,
    }
}

fn sync_kind_of(kind: SyncKind) -> pb::TimelineSyncKind {
    match kind {
        SyncKind::Nodes => pb::TimelineSyncKind::Nodes,
        SyncKind::Services => pb::TimelineSyncKind::Services,
        SyncKind::IpIdentities => pb::TimelineSyncKind::IpIdentities,
    }
}

fn waiter_of(waiter: Waiter) -> pb::Waiter {
    match waiter {
        Waiter::Readiness => pb::Waiter::Readiness,
        Waiter::Regeneration => pb::Waiter::Regeneration,
        Waiter::Prune => pb::Waiter::Prune,
        Waiter::WireguardGc => pb::Waiter::WireguardGc,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use tokio::time::Instant;

    use super::*;

    #[test]
    fn steps_carry_their_offset_in_microseconds_and_only_their_fields() {
        let start = Instant::now();
        let mut timeline = Timeline::new(start, SystemTime::UNIX_EPOCH, 8);
        timeline.record(
            start + Duration::from_micros(1500),
            Step::ListDone {
                cluster: Arc::from("c2"),
                resource: Resource::IpCache,
            },
        );
        timeline.record(
            start + Duration::from_secs(60),
            Step::WaitReturned {
                waiter: Waiter::Regeneration,
                kind: SyncKind::IpIdentities,
                end: WaitEnd::Breaker {
                    pending: vec!["c3".to_owned()],
                },
            },
        );
        let response = timeline_response(&timeline);
        assert_eq!(response.started_at, "1970-01-01T00:00:00.000Z");
        assert_eq!(response.dropped, 0);
        let [started, listed, waited] = response.steps.as_slice() else {
            panic!("three steps: {response:?}");
        };
        assert_eq!(started.r#type(), pb::StepType::Started);
        assert_eq!(listed.offset_us, 1500);
        assert_eq!(listed.cluster, "c2");
        assert_eq!(listed.resource(), pb::TimelineResource::Ipcache);
        assert_eq!(listed.sync_kind(), pb::TimelineSyncKind::Unspecified);
        assert_eq!(waited.offset_us, 60_000_000);
        assert_eq!(waited.waiter(), pb::Waiter::Regeneration);
        assert_eq!(waited.wait_end(), pb::WaitEnd::Breaker);
        assert_eq!(waited.pending, ["c3"]);
        assert!(waited.cluster.is_empty() && waited.error.is_none());
    }
}
