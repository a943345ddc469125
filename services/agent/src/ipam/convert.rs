//! Between the protos (the operator's `meshwork.ipam.v1`, the agent's `meshwork.agent.v1`
//! Ipam) and the plain types of `meshwork-ipam`.
//!
//! A snapshot entry that cannot be read (an address that is not IPv4, an ENI whose subnet
//! CIDR is unreadable) is not dropped: it is described in [`Snapshot::malformed`], which
//! makes the whole snapshot inconsistent, so it is waited out like one that names a missing
//! ENI.

use std::net::Ipv4Addr;

use meshwork_ipam::{Allocation, Eni, Ipv4Cidr, ReleaseState, Report, Snapshot, Watermarks};
use meshwork_proto::agent::v1 as agent_pb;
use meshwork_proto::ipam::v1 as pb;

/// The operator's snapshot as the ENI pool reads it.
pub fn snapshot(proto: pb::NodeSnapshot) -> Snapshot {
    let mut malformed = Vec::new();
    let mut enis = std::collections::BTreeMap::new();
    for eni in proto.enis {
        let subnet = match eni.subnet_cidr.parse::<Ipv4Cidr>() {
            Ok(subnet) => subnet,
            Err(err) => {
                malformed.push(format!("ENI {}'s subnet CIDR: {err}", eni.id));
                continue;
            }
        };
        let mut vpc_cidrs = Vec::new();
        for cidr in &eni.vpc_cidrs {
            match cidr.parse::<Ipv4Cidr>() {
                Ok(cidr) => vpc_cidrs.push(cidr),
                Err(err) => malformed.push(format!("ENI {}'s VPC CIDR: {err}", eni.id)),
            }
        }
        enis.insert(
            eni.id.clone(),
            Eni {
                id: eni.id,
                mac: eni.mac,
                number: eni.number,
                subnet,
                vpc_cidrs,
            },
        );
    }
    let mut pool = std::collections::BTreeMap::new();
    for entry in proto.pool {
        match entry.ip.parse::<Ipv4Addr>() {
            Ok(ip) => {
                pool.insert(ip, entry.resource);
            }
            Err(_) => malformed.push(format!("pool IP {:?} is not an IPv4 address", entry.ip)),
        }
    }
    let mut release = std::collections::BTreeMap::new();
    for (ip, state) in proto.release_ips {
        match ip.parse::<Ipv4Addr>() {
            Ok(ip) => {
                release.insert(ip, ReleaseState::from_wire(&state));
            }
            Err(_) => malformed.push(format!("release-ips {ip:?} is not an IPv4 address")),
        }
    }
    malformed.sort();
    let count = |n: i32| u32::try_from(n).unwrap_or(0);
    Snapshot {
        generation: proto.generation,
        enis,
        pool,
        release,
        watermarks: Watermarks {
            pre_allocate: count(proto.pre_allocate),
            min_allocate: count(proto.min_allocate),
            max_allocate: count(proto.max_allocate),
            max_above_watermark: count(proto.max_above_watermark),
        },
        operator_error: proto.operator_error,
        malformed,
    }
}

/// A report as `ReportUsage` sends it.
pub fn report(node: &str, report: &Report) -> pb::ReportUsageRequest {
    pb::ReportUsageRequest {
        node: node.to_owned(),
        generation: report.generation.clone(),
        used: report
            .used
            .iter()
            .map(|used| pb::UsedIp {
                ip: used.ip.to_string(),
                owner: used.owner.clone(),
                resource: used.resource.clone(),
            })
            .collect(),
        release_answers: report
            .answers
            .iter()
            .map(|(ip, answer)| (ip.to_string(), answer.as_str().to_owned()))
            .collect(),
    }
}

/// An allocation as `Ipam.Allocate` answers it.
pub fn allocate_response(allocation: &Allocation, existing: bool) -> agent_pb::AllocateResponse {
    let eni = allocation.eni.as_ref();
    agent_pb::AllocateResponse {
        ip: allocation.ip.to_string(),
        prefix_len: u32::from(allocation.prefix_len),
        gateway: allocation.gateway.to_string(),
        eni_id: eni.map(|e| e.id.clone()).unwrap_or_default(),
        eni_mac: eni.map(|e| e.mac.clone()).unwrap_or_default(),
        interface_number: eni.map_or(0, |e| e.number),
        vpc_cidrs: eni
            .map(|e| e.vpc_cidrs.iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        generation: allocation.generation.clone(),
        existing,
    }
}

/// An allocation as `Ipam.Status` lists it.
pub fn ip_allocation(allocation: &Allocation) -> agent_pb::IpAllocation {
    agent_pb::IpAllocation {
        ip: allocation.ip.to_string(),
        owner: allocation.owner.clone(),
        pod: allocation.pod.clone(),
        eni_id: allocation
            .eni
            .as_ref()
            .map(|e| e.id.clone())
            .unwrap_or_default(),
        generation: allocation.generation.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto() -> pb::NodeSnapshot {
        pb::NodeSnapshot {
            node: "n1".into(),
            generation: "17".into(),
            enis: vec![pb::Eni {
                id: "eni-1".into(),
                ip: "10.0.1.5".into(),
                mac: "02:aa:00:00:00:01".into(),
                number: 1,
                subnet_id: "subnet-1".into(),
                subnet_cidr: "10.0.1.0/24".into(),
                vpc_id: "vpc-1".into(),
                vpc_cidrs: vec!["10.0.0.0/16".into(), "100.64.0.0/16".into()],
                ..pb::Eni::default()
            }],
            pool: vec![
                pb::PoolIp {
                    ip: "10.0.1.10".into(),
                    resource: "eni-1".into(),
                },
                pb::PoolIp {
                    ip: "10.0.1.11".into(),
                    resource: "eni-1".into(),
                },
            ],
            release_ips: [("10.0.1.11".to_owned(), "marked-for-release".to_owned())].into(),
            pre_allocate: 8,
            min_allocate: 2,
            max_allocate: -1,
            max_above_watermark: 4,
            operator_error: String::new(),
        }
    }

    #[test]
    fn a_snapshot_reads_every_field_it_needs() {
        let snapshot = snapshot(proto());
        assert_eq!(snapshot.check(), Ok(()));
        assert_eq!(snapshot.generation, "17");
        let eni = &snapshot.enis["eni-1"];
        assert_eq!(
            (eni.number, eni.subnet.first_host()),
            (1, "10.0.1.1".parse().unwrap())
        );
        assert_eq!(eni.vpc_cidrs.len(), 2);
        assert_eq!(snapshot.pool.len(), 2);
        assert_eq!(
            snapshot.release[&"10.0.1.11".parse().unwrap()],
            ReleaseState::MarkedForRelease
        );
        assert_eq!(
            snapshot.watermarks,
            Watermarks {
                pre_allocate: 8,
                min_allocate: 2,
                max_allocate: 0,
                max_above_watermark: 4
            }
        );
        assert_eq!(snapshot.watermarks.required(), 2);
    }

    #[test]
    fn an_unreadable_entry_makes_the_snapshot_inconsistent_not_smaller() {
        let mut bad = proto();
        bad.pool.push(pb::PoolIp {
            ip: "fd00::10".into(),
            resource: "eni-1".into(),
        });
        bad.enis.push(pb::Eni {
            id: "eni-2".into(),
            subnet_cidr: "nonsense".into(),
            ..pb::Eni::default()
        });
        bad.pool.push(pb::PoolIp {
            ip: "10.0.2.10".into(),
            resource: "eni-2".into(),
        });
        let err = snapshot(bad).check().unwrap_err();
        assert_eq!(err.missing.len(), 1, "{err}");
        assert_eq!(err.malformed.len(), 2, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("fd00::10") && text.contains("eni-2"),
            "{text}"
        );
    }
}
