//! `ReportUsage`: the agent's side of the CiliumNode, `status.ipam.used` and its answers
//! in `status.ipam.release-ips`, checked and applied as plain functions. [`validate`] checks
//! the request alone (INVALID_ARGUMENT); [`apply`] computes the object to write from the
//! stored one, and runs again on every re-read after a conflicting write, so a refusal it
//! finds there (a used IP not in the pool) is found on the object that would have been
//! written over, and nothing is written.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use meshwork_proto::ipam::v1::ReportUsageRequest;
use tonic::Status;

use super::node_name;
use crate::cilium_node::{AllocationIp, AllocationMap, CiliumNode};
use crate::manager::Generation;
use crate::node_allocator::release::{
    DO_NOT_RELEASE, MARKED_FOR_RELEASE, READY_FOR_RELEASE, RELEASED,
};

/// A well-formed report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The node.
    pub node: String,
    /// The generation it answers.
    pub generation: String,
    /// `status.ipam.used` as reported.
    pub used: AllocationMap,
    /// Address → [`READY_FOR_RELEASE`] or [`DO_NOT_RELEASE`].
    pub answers: BTreeMap<String, &'static str>,
}

/// `text` if it is an IPv4 address written the way the pool writes it.
fn ipv4(what: &str, text: &str) -> Result<String, Status> {
    match text.parse::<Ipv4Addr>() {
        Ok(ip) if ip.to_string() == text => Ok(text.to_owned()),
        _ => Err(Status::invalid_argument(format!(
            "{what} {text:?} is not an IPv4 address (dotted quad)"
        ))),
    }
}

/// Checks what the request says by itself.
pub fn validate(request: ReportUsageRequest) -> Result<Report, Status> {
    node_name(&request.node)?;
    let mut used = AllocationMap::new();
    for entry in request.used {
        let ip = ipv4("used IP", &entry.ip)?;
        let allocation = AllocationIp {
            owner: entry.owner,
            resource: entry.resource,
        };
        if used.insert(ip, allocation).is_some() {
            return Err(Status::invalid_argument(format!(
                "used IP {:?} is listed twice",
                entry.ip
            )));
        }
    }
    let mut answers = BTreeMap::new();
    for (ip, answer) in request.release_answers {
        let ip = ipv4("release answer for", &ip)?;
        let answer = match answer.as_str() {
            READY_FOR_RELEASE => READY_FOR_RELEASE,
            DO_NOT_RELEASE => DO_NOT_RELEASE,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "release answer {answer:?} for {ip}: answers are \
                     {READY_FOR_RELEASE:?} or {DO_NOT_RELEASE:?}"
                )));
            }
        };
        answers.insert(ip, answer);
    }
    Ok(Report {
        node: request.node,
        generation: request.generation,
        used,
        answers,
    })
}

/// Why [`apply`] refused the stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// There is no stored object (deleted meanwhile).
    NotFound,
    /// A used IP is not in the stored pool.
    NotInPool(String),
}

impl Refusal {
    /// The status the client gets.
    pub fn status(&self, node: &str) -> Status {
        match self {
            Self::NotFound => Status::not_found(format!("no CiliumNode {node:?} in the store")),
            Self::NotInPool(ip) => Status::invalid_argument(format!(
                "used IP {ip} is not in node {node:?}'s pool (spec.ipam.pool)"
            )),
        }
    }
}

/// What `report` (answering the snapshot `answered`) makes of the stored `current`:
/// `status.ipam.used` replaced; each answer written for an address `answered` marked for
/// release and still marked in `current`; each `released` entry of an address `answered`
/// showed gone from the pool removed, if it is still so. Returns the object to write
/// (`None` if nothing changes) and how many answers it applies.
pub fn apply(
    report: &Report,
    answered: &Generation,
    current: Option<&CiliumNode>,
) -> Result<(Option<CiliumNode>, u32), Refusal> {
    let current = current.ok_or(Refusal::NotFound)?;
    let pool = &current.spec.ipam.pool;
    if let Some(ip) = report.used.keys().find(|ip| !pool.contains_key(*ip)) {
        return Err(Refusal::NotInPool(ip.clone()));
    }
    let mut node = current.clone();
    let ipam = &mut node.status.get_or_insert_default().ipam;
    ipam.used.clone_from(&report.used);
    let mut applied = 0;
    for (ip, answer) in &report.answers {
        let still_marked = ipam.release_ips.get(ip).map(String::as_str) == Some(MARKED_FOR_RELEASE);
        if answered.marked.contains(ip) && still_marked {
            ipam.release_ips.insert(ip.clone(), (*answer).to_owned());
            applied += 1;
        }
    }
    for ip in &answered.released {
        if ipam.release_ips.get(ip).map(String::as_str) == Some(RELEASED) && !pool.contains_key(ip)
        {
            ipam.release_ips.remove(ip);
        }
    }
    Ok(((node != *current).then_some(node), applied))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cilium_node::{CiliumNodeSpec, CiliumNodeStatus};
    use meshwork_proto::ipam::v1::UsedIp;

    fn request(used: &[&str], answers: &[(&str, &str)]) -> ReportUsageRequest {
        ReportUsageRequest {
            node: "node-1".to_owned(),
            generation: "7".to_owned(),
            used: used
                .iter()
                .map(|ip| UsedIp {
                    ip: (*ip).to_owned(),
                    owner: "default/pod".to_owned(),
                    resource: "eni-1".to_owned(),
                })
                .collect(),
            release_answers: answers
                .iter()
                .map(|(ip, answer)| ((*ip).to_owned(), (*answer).to_owned()))
                .collect(),
        }
    }

    /// Pool .1–.4 on eni-1; .3 marked, .9 released (gone from the pool).
    fn stored() -> CiliumNode {
        let mut node = CiliumNode::new("node-1", CiliumNodeSpec::default());
        node.metadata.resource_version = Some("7".to_owned());
        for last in 1..=4 {
            node.spec.ipam.pool.insert(
                format!("10.0.0.{last}"),
                AllocationIp {
                    owner: String::new(),
                    resource: "eni-1".to_owned(),
                },
            );
        }
        let mut status = CiliumNodeStatus::default();
        status
            .ipam
            .release_ips
            .insert("10.0.0.3".to_owned(), MARKED_FOR_RELEASE.to_owned());
        status
            .ipam
            .release_ips
            .insert("10.0.0.9".to_owned(), RELEASED.to_owned());
        node.status = Some(status);
        node
    }

    fn code(result: Result<Report, Status>) -> tonic::Code {
        result.expect_err("refused").code()
    }

    #[test]
    fn malformed_reports_are_invalid_arguments() {
        use tonic::Code::InvalidArgument;
        let mut bad_node = request(&[], &[]);
        bad_node.node = "Not A Node".to_owned();
        assert_eq!(code(validate(bad_node)), InvalidArgument);
        for ip in ["10.0.0.256", "fd00::1", "10.0.0.01", ""] {
            assert_eq!(code(validate(request(&[ip], &[]))), InvalidArgument, "{ip}");
        }
        assert_eq!(
            code(validate(request(&["10.0.0.1", "10.0.0.1"], &[]))),
            InvalidArgument
        );
        let bad_answer = validate(request(&[], &[("10.0.0.3", "released")]));
        let status = bad_answer.expect_err("the operator's own state is no answer");
        assert_eq!(status.code(), InvalidArgument);
        assert!(status.message().contains("ready-for-release"), "{status}");
        assert_eq!(
            code(validate(request(&[], &[("nope", READY_FOR_RELEASE)]))),
            InvalidArgument
        );
        assert!(validate(request(&["10.0.0.1"], &[("10.0.0.3", DO_NOT_RELEASE)])).is_ok());
    }

    #[test]
    fn usage_is_written_and_answers_apply_only_to_addresses_still_marked() {
        let current = stored();
        let answered = Generation::of(&current);
        let report = validate(request(
            &["10.0.0.1"],
            &[
                ("10.0.0.3", READY_FOR_RELEASE),
                // Never marked: ignored, not an error.
                ("10.0.0.4", READY_FOR_RELEASE),
            ],
        ))
        .expect("valid");
        let (written, applied) = apply(&report, &answered, Some(&current)).expect("applies");
        let written = written.expect("a change");
        let ipam = &written.status.as_ref().expect("status").ipam;
        assert_eq!(applied, 1);
        assert_eq!(ipam.used.keys().collect::<Vec<_>>(), ["10.0.0.1"]);
        assert_eq!(ipam.used["10.0.0.1"].owner, "default/pod");
        assert_eq!(
            ipam.release_ips.get("10.0.0.3").map(String::as_str),
            Some(READY_FOR_RELEASE)
        );
        assert!(!ipam.release_ips.contains_key("10.0.0.4"));
        assert!(
            !ipam.release_ips.contains_key("10.0.0.9"),
            "a released address the snapshot showed gone is acknowledged"
        );

        // The same report again: the answer is no longer to a marked address.
        let (again, applied) = apply(&report, &answered, Some(&written)).expect("applies");
        assert_eq!((again, applied), (None, 0), "nothing to write");
    }

    #[test]
    fn an_answer_to_a_mark_the_snapshot_did_not_show_is_not_applied() {
        let current = stored();
        // The agent answers an older snapshot, from before 10.0.0.3 was marked.
        let answered = Generation {
            generation: "5".to_owned(),
            ..Generation::default()
        };
        let report = validate(request(&[], &[("10.0.0.3", READY_FOR_RELEASE)])).expect("valid");
        let (written, applied) = apply(&report, &answered, Some(&current)).expect("applies");
        assert_eq!((written, applied), (None, 0), "nothing to write");
        let release_ips = &current.status.as_ref().expect("status").ipam.release_ips;
        assert_eq!(
            release_ips.get("10.0.0.3").map(String::as_str),
            Some(MARKED_FOR_RELEASE)
        );
        assert!(
            release_ips.contains_key("10.0.0.9"),
            "a release it did not see is not acknowledged"
        );
    }

    #[test]
    fn a_used_ip_outside_the_pool_or_a_missing_node_is_refused() {
        let current = stored();
        let answered = Generation::of(&current);
        let report = validate(request(&["10.0.0.1", "10.0.0.77"], &[])).expect("valid");
        assert_eq!(
            apply(&report, &answered, Some(&current)),
            Err(Refusal::NotInPool("10.0.0.77".to_owned()))
        );
        assert_eq!(
            apply(&report, &answered, None),
            Err(Refusal::NotFound),
            "a deleted node is not recreated"
        );
        let status = Refusal::NotInPool("10.0.0.77".to_owned()).status("node-1");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
}
