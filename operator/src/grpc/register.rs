//! `RegisterNode`: the agent declares its CiliumNode's spec (`spec.eni` and the watermarks
//! of `spec.ipam`), checked and applied as plain functions. What the request does not carry
//! stays as stored: `spec.eni.vpc-id`, `availability-zone`, `delete-on-termination`, and
//! the operator's pool. The same spec again writes nothing.

use meshwork_proto::ipam::v1::RegisterNodeRequest;
use tonic::Status;

use super::node_name;
use crate::cilium_node::{CiliumNode, CiliumNodeSpec, StringMap};
use crate::node_allocator::spec::DEFAULT_PRE_ALLOCATE;

/// A well-formed registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The node.
    pub node: String,
    /// `spec.eni.instance-id`.
    pub instance_id: String,
    /// `spec.eni.instance-type`; empty: keep the stored one, else ask EC2.
    pub instance_type: String,
    /// `spec.eni.subnet-tags`.
    pub subnet_tags: StringMap,
    /// `spec.eni.subnet-ids`.
    pub subnet_ids: Vec<String>,
    /// `spec.eni.security-group-tags`.
    pub security_group_tags: StringMap,
    /// `spec.eni.security-groups`.
    pub security_groups: Vec<String>,
    /// `spec.eni.first-interface-index`.
    pub first_interface_index: Option<i64>,
    /// `spec.eni.exclude-interface-tags`.
    pub exclude_interface_tags: StringMap,
    /// `spec.ipam.pre-allocate` (Cilium's default when the request has none).
    pub pre_allocate: i64,
    /// `spec.ipam.min-allocate`.
    pub min_allocate: i64,
    /// `spec.ipam.max-allocate`.
    pub max_allocate: i64,
    /// `spec.ipam.max-above-watermark`.
    pub max_above_watermark: i64,
}

fn non_negative(what: &str, value: i32) -> Result<i64, Status> {
    if value < 0 {
        return Err(Status::invalid_argument(format!(
            "{what} is {value}: it must not be negative"
        )));
    }
    Ok(i64::from(value))
}

/// Checks what the request says by itself.
pub fn validate(request: RegisterNodeRequest) -> Result<Registration, Status> {
    node_name(&request.node)?;
    if request.instance_id.is_empty() {
        return Err(Status::invalid_argument(
            "instance_id (spec.eni.instance-id) is required",
        ));
    }
    let pre_allocate = match request.pre_allocate {
        Some(pre) => non_negative("pre_allocate", pre)?,
        None => DEFAULT_PRE_ALLOCATE,
    };
    let min_allocate = non_negative("min_allocate", request.min_allocate)?;
    let max_allocate = non_negative("max_allocate", request.max_allocate)?;
    let max_above_watermark = non_negative("max_above_watermark", request.max_above_watermark)?;
    let first_interface_index = request
        .first_interface_index
        .map(|index| non_negative("first_interface_index", index))
        .transpose()?;
    if max_allocate > 0 && min_allocate > max_allocate {
        return Err(Status::invalid_argument(format!(
            "min_allocate {min_allocate} is above max_allocate {max_allocate}"
        )));
    }
    Ok(Registration {
        node: request.node,
        instance_id: request.instance_id,
        instance_type: request.instance_type,
        subnet_tags: request.subnet_tags.into_iter().collect(),
        subnet_ids: request.subnet_ids,
        security_group_tags: request.security_group_tags.into_iter().collect(),
        security_groups: request.security_groups,
        first_interface_index,
        exclude_interface_tags: request.exclude_interface_tags.into_iter().collect(),
        pre_allocate,
        min_allocate,
        max_allocate,
        max_above_watermark,
    })
}

/// The registration names no instance type and the stored object has none for its
/// instance: it must come from EC2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeedsInstanceType;

/// What `registration` makes of the stored `current` (`None`: create it): the object to
/// write, `None` when the spec is already as registered.
pub fn apply(
    registration: &Registration,
    current: Option<&CiliumNode>,
) -> Result<Option<CiliumNode>, NeedsInstanceType> {
    let mut node = current
        .cloned()
        .unwrap_or_else(|| CiliumNode::new(&registration.node, CiliumNodeSpec::default()));
    let eni = &mut node.spec.eni;
    let same_instance = eni.instance_id == registration.instance_id;
    if !registration.instance_type.is_empty() {
        eni.instance_type.clone_from(&registration.instance_type);
    } else if !same_instance || eni.instance_type.is_empty() {
        return Err(NeedsInstanceType);
    }
    eni.instance_id.clone_from(&registration.instance_id);
    eni.subnet_tags.clone_from(&registration.subnet_tags);
    eni.subnet_ids.clone_from(&registration.subnet_ids);
    eni.security_group_tags
        .clone_from(&registration.security_group_tags);
    eni.security_groups
        .clone_from(&registration.security_groups);
    eni.first_interface_index = registration.first_interface_index;
    eni.exclude_interface_tags
        .clone_from(&registration.exclude_interface_tags);
    let ipam = &mut node.spec.ipam;
    if current.is_some() && !same_instance {
        // A node name reused by another instance: the old pool's IPs are on ENIs that are not
        // this instance's, and a snapshot must never offer them (the next pass fills it).
        ipam.pool.clear();
    }
    ipam.pre_allocate = registration.pre_allocate;
    ipam.min_allocate = registration.min_allocate;
    ipam.max_allocate = registration.max_allocate;
    ipam.max_above_watermark = registration.max_above_watermark;
    Ok(match current {
        Some(current) if current.spec == node.spec => None,
        _ => Some(node),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RegisterNodeRequest {
        RegisterNodeRequest {
            node: "node-1".to_owned(),
            instance_id: "i-1".to_owned(),
            instance_type: "m5.large".to_owned(),
            first_interface_index: Some(1),
            subnet_tags: [("tier".to_owned(), "pods".to_owned())].into(),
            ..RegisterNodeRequest::default()
        }
    }

    #[test]
    fn a_registration_creates_the_spec_with_ciliums_default_pre_allocate() {
        let registration = validate(request()).expect("valid");
        let created = apply(&registration, None).expect("typed").expect("created");
        assert_eq!(created.metadata.name.as_deref(), Some("node-1"));
        assert_eq!(created.spec.eni.instance_id, "i-1");
        assert_eq!(created.spec.eni.first_interface_index, Some(1));
        assert_eq!(created.spec.eni.subnet_tags["tier"], "pods");
        assert_eq!(created.spec.ipam.pre_allocate, 8);
        assert!(created.status.is_none());
    }

    #[test]
    fn the_same_spec_writes_nothing_and_a_change_keeps_what_the_request_does_not_carry() {
        let registration = validate(request()).expect("valid");
        let mut stored = apply(&registration, None).expect("typed").expect("created");
        stored.spec.eni.vpc_id = "vpc-1".to_owned();
        stored
            .spec
            .ipam
            .pool
            .insert("10.0.0.5".to_owned(), Default::default());
        assert_eq!(apply(&registration, Some(&stored)), Ok(None));

        let mut changed = request();
        changed.min_allocate = 12;
        changed.pre_allocate = Some(2);
        let changed = validate(changed).expect("valid");
        let written = apply(&changed, Some(&stored))
            .expect("typed")
            .expect("a change");
        assert_eq!(
            (
                written.spec.ipam.pre_allocate,
                written.spec.ipam.min_allocate
            ),
            (2, 12)
        );
        assert_eq!(written.spec.eni.vpc_id, "vpc-1", "kept");
        assert_eq!(written.spec.ipam.pool.len(), 1, "the operator's pool kept");

        // Another instance under the same name: the old instance's pool must go.
        let mut moved = request();
        moved.instance_id = "i-2".to_owned();
        let moved = validate(moved).expect("valid");
        let written = apply(&moved, Some(&stored))
            .expect("typed")
            .expect("a change");
        assert_eq!(written.spec.eni.instance_id, "i-2");
        assert!(
            written.spec.ipam.pool.is_empty(),
            "the old instance's pool offered"
        );
    }

    #[test]
    fn an_empty_instance_type_keeps_the_stored_one_of_the_same_instance() {
        let stored = apply(&validate(request()).expect("valid"), None)
            .expect("typed")
            .expect("created");
        let mut untyped = request();
        untyped.instance_type.clear();
        let untyped = validate(untyped).expect("valid");
        assert_eq!(apply(&untyped, Some(&stored)), Ok(None));
        assert_eq!(apply(&untyped, None), Err(NeedsInstanceType));
        let mut moved = untyped;
        moved.instance_id = "i-2".to_owned();
        assert_eq!(apply(&moved, Some(&stored)), Err(NeedsInstanceType));
    }

    #[test]
    fn bad_registrations_are_invalid_arguments() {
        let mut cases = Vec::new();
        let mut r = request();
        r.node = "Node_1".to_owned();
        cases.push(r);
        let mut r = request();
        r.instance_id.clear();
        cases.push(r);
        let mut r = request();
        r.pre_allocate = Some(-1);
        cases.push(r);
        let mut r = request();
        r.max_above_watermark = -2;
        cases.push(r);
        let mut r = request();
        r.first_interface_index = Some(-1);
        cases.push(r);
        let mut r = request();
        r.min_allocate = 10;
        r.max_allocate = 5;
        cases.push(r);
        for case in cases {
            let status = validate(case.clone()).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{case:?}");
        }
        let mut unlimited = request();
        unlimited.min_allocate = 10;
        assert!(validate(unlimited).is_ok(), "max-allocate 0 is no limit");
    }
}
