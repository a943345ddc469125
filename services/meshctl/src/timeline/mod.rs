//! `meshctl timeline`: when each step of the agent's current start happened, as a table,
//! as JSON, or drawn (`--svg`, `--png`). The drawing goes model → layout → render:
//!
//! - [`model`]: the agent's answer as typed steps, and how each reads;
//! - [`table`]: the table and the JSON;
//! - [`layout`]: the picture's geometry (rows, bars, markers, lines), unit-tested;
//! - [`render`]: plotters draws the layout; [`font`] finds the PNG's font.

mod font;
mod layout;
mod model;
mod render;
mod table;

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use meshwork_proto::agent::v1::TimelineRequest;
use meshwork_proto::agent::v1::agent_client::AgentClient;

use self::model::Timeline;
use crate::cli::TimelineArgs;
use crate::client::{Agent, call_error};
use crate::status::print_text;

/// Runs `meshctl timeline` against the agent at `socket`.
pub async fn run(socket: &Path, args: &TimelineArgs) -> anyhow::Result<ExitCode> {
    let channel = Agent::new(socket).channel().await?;
    let reply = AgentClient::new(channel)
        .timeline(TimelineRequest {})
        .await
        .map_err(|status| call_error(socket, "Agent/Timeline", &status))?;
    let timeline = Timeline::from_proto(&reply.into_inner());
    if args.svg.is_some() || args.png.is_some() {
        let layout = layout::layout(&timeline, &args.title);
        if let Some(path) = &args.svg {
            let svg = render::svg(&layout)?;
            std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(path) = &args.png {
            font::register(args.font.as_deref())?;
            render::png(&layout, path)?;
        }
    }
    let text = if args.json {
        format!("{}\n", table::to_json(&timeline))
    } else {
        table::render(&timeline)
    };
    print_text(&text)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use meshwork_proto::agent::v1 as pb;

    use super::model::Timeline;

    fn step(ms: u64, r#type: pb::StepType) -> pb::TimelineStep {
        let mut step = pb::TimelineStep {
            offset_us: ms * 1000,
            ..Default::default()
        };
        step.set_type(r#type);
        step
    }

    fn list_done(ms: u64, cluster: &str, resource: pb::TimelineResource) -> pb::TimelineStep {
        let mut step = step(ms, pb::StepType::ListDone);
        step.cluster = cluster.to_owned();
        step.set_resource(resource);
        step
    }

    fn wait(
        ms: u64,
        waiter: pb::Waiter,
        kind: pb::TimelineSyncKind,
        end: pb::WaitEnd,
    ) -> pb::TimelineStep {
        let mut step = step(ms, pb::StepType::WaitReturned);
        step.set_waiter(waiter);
        step.set_sync_kind(kind);
        step.set_wait_end(end);
        step
    }

    /// The rows of [`sample`], in order: clusters by name, stores in status order.
    pub const SAMPLE_ROWS: [&str; 8] = [
        "c1 · nodes",
        "c1 · services",
        "c1 · identities",
        "c1 · ipcache",
        "c2 · nodes",
        "c2 · services",
        "c2 · identities",
        "c2 · ipcache",
    ];

    /// A restart of an agent with remotes c1 and c2 (connected in the other order): with
    /// `breaker`, c2 never lists and regeneration's wait gives up after 1 s; without, c2
    /// lists late and every wait returns synced.
    pub fn sample(breaker: bool) -> Timeline {
        use pb::TimelineResource::{Identities, Ipcache, Nodes, Services};
        use pb::TimelineSyncKind as Kind;
        let mut steps = vec![step(0, pb::StepType::Started)];
        for (ms, cluster) in [(12, "c1"), (15, "c2")] {
            let mut connected = step(ms, pb::StepType::Connected);
            connected.cluster = cluster.to_owned();
            steps.push(connected);
        }
        for (i, resource) in [Nodes, Services, Identities, Ipcache]
            .into_iter()
            .enumerate()
        {
            steps.push(list_done(50 + 10 * i as u64, "c1", resource));
        }
        let waited = if breaker {
            let mut waited = wait(
                1000,
                pb::Waiter::Regeneration,
                Kind::IpIdentities,
                pb::WaitEnd::Breaker,
            );
            waited.pending = vec!["c2".to_owned()];
            waited
        } else {
            // c2 lists in the other order than status shows: rows keep status order.
            for (i, resource) in [Ipcache, Identities, Services, Nodes]
                .into_iter()
                .enumerate()
            {
                steps.push(list_done(200 + 10 * i as u64, "c2", resource));
            }
            wait(
                300,
                pb::Waiter::Regeneration,
                Kind::IpIdentities,
                pb::WaitEnd::Synced,
            )
        };
        let at = waited.offset_us / 1000;
        steps.push(waited);
        let mut gc = step(at + 5, pb::StepType::WireguardGc);
        gc.set_sync_kind(Kind::Nodes);
        gc.removed = 2;
        let mut pruned = step(at + 10, pb::StepType::Pruned);
        pruned.set_sync_kind(Kind::Services);
        pruned.removed = 3;
        let mut regenerated = step(at + 20, pb::StepType::EndpointRegenerated);
        regenerated.endpoint_id = 1;
        steps.extend([gc, pruned, regenerated]);
        Timeline::from_proto(&pb::TimelineResponse {
            started_at: "2026-11-29T10:00:00.000Z".to_owned(),
            steps,
            dropped: 0,
        })
    }
}
