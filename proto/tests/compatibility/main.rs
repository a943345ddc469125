//! `v1` packages only grow: each one's descriptor set is checked in under
//! `proto/compat/<package>.binpb`, and the API compiled into the crate must not break a
//! client built from it (see [`breaking`] for the rules, after `buf breaking`).
//!
//! - An intended addition is accepted by rewriting the snapshots:
//!   `MESHWORK_ACCEPT_API=1 cargo test -p meshwork-proto --test compatibility`.
//! - A breaking change cannot be accepted: put it in a new package (`v2`) beside `v1`.
//! - Retiring a whole package is a decision, not a side effect: delete its snapshot in the
//!   same commit and say why.

mod breaking;

use std::path::{Path, PathBuf};

use breaking::{Api, compare};
use meshwork_proto::FILE_DESCRIPTOR_SET;
use prost::Message as _;
use prost_types::FileDescriptorSet;

const ACCEPT: &str = "MESHWORK_ACCEPT_API";

fn snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("compat")
}

fn snapshot_path(package: &str) -> PathBuf {
    snapshot_dir().join(format!("{package}.binpb"))
}

fn compiled() -> FileDescriptorSet {
    FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("the compiled descriptor set")
}

/// The stable packages compiled into the crate: `meshwork.*.v1`.
fn stable_packages(set: &FileDescriptorSet) -> Vec<String> {
    let mut packages: Vec<String> = set
        .file
        .iter()
        .map(|f| f.package().to_owned())
        .filter(|p| p.starts_with("meshwork.") && p.ends_with(".v1"))
        .collect();
    packages.sort();
    packages.dedup();
    packages
}

/// `package`'s files of `set`, without comments (a comment is not the API's shape).
fn package_set(set: &FileDescriptorSet, package: &str) -> FileDescriptorSet {
    FileDescriptorSet {
        file: set
            .file
            .iter()
            .filter(|f| f.package() == package)
            .cloned()
            .map(|mut f| {
                f.source_code_info = None;
                f
            })
            .collect(),
    }
}

fn read_snapshot(path: &Path) -> Option<FileDescriptorSet> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        FileDescriptorSet::decode(bytes.as_slice())
            .unwrap_or_else(|err| panic!("{} is not a descriptor set: {err}", path.display())),
    )
}

#[test]
fn v1_packages_do_not_break_existing_clients() {
    let accept = std::env::var_os(ACCEPT).is_some();
    let set = compiled();
    let packages = stable_packages(&set);
    assert!(!packages.is_empty(), "no meshwork.*.v1 package compiled");
    let mut breaking = Vec::new();
    let mut unaccepted = Vec::new();
    for package in &packages {
        let path = snapshot_path(package);
        let current = package_set(&set, package);
        let changes = match read_snapshot(&path) {
            Some(old) => compare(&Api::of(&old, package), &Api::of(&current, package)),
            None => breaking::Changes {
                additions: vec![format!("package {package}")],
                ..Default::default()
            },
        };
        breaking.extend(changes.breaking.iter().map(|c| format!("{package}: {c}")));
        if changes.breaking.is_empty() && !changes.additions.is_empty() {
            if accept {
                std::fs::create_dir_all(snapshot_dir()).expect("create proto/compat");
                std::fs::write(&path, current.encode_to_vec())
                    .unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
                eprintln!("accepted into {}: {:?}", path.display(), changes.additions);
            } else {
                unaccepted.extend(changes.additions.iter().map(|c| format!("{package}: {c}")));
            }
        }
    }
    // A snapshot without its package: the package was removed.
    for entry in std::fs::read_dir(snapshot_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(package) = name.strip_suffix(".binpb")
            && !packages.iter().any(|p| p == package)
        {
            breaking.push(format!(
                "package {package} was removed (its snapshot {name} is still checked in)"
            ));
        }
    }
    assert!(
        breaking.is_empty(),
        "changes that break existing clients of a v1 package:\n  {}\n\
         Keep v1 as it is and put the change in a new package (v2).",
        breaking.join("\n  ")
    );
    assert!(
        unaccepted.is_empty(),
        "the v1 API grew (compatible):\n  {}\n\
         If that is intended, accept it: {ACCEPT}=1 cargo test -p meshwork-proto --test compatibility",
        unaccepted.join("\n  ")
    );
}

// The negative controls: each breaking change, made to today's API, is found.

fn agent_api() -> Api {
    Api::of(&compiled(), "meshwork.agent.v1")
}

fn breaks(change: impl FnOnce(&mut Api)) -> Vec<String> {
    let old = agent_api();
    let mut new = old.clone();
    change(&mut new);
    compare(&old, &new).breaking
}

const STATUS: &str = "meshwork.agent.v1.RemoteClusterStatus";
const AGENT: &str = "meshwork.agent.v1.Agent";

#[test]
fn the_same_api_changes_nothing() {
    let changes = compare(&agent_api(), &agent_api());
    assert!(changes.breaking.is_empty() && changes.additions.is_empty());
}

#[test]
fn a_removed_field_breaks_unless_reserved() {
    let found = breaks(|api| {
        api.messages
            .get_mut(STATUS)
            .expect("message")
            .fields
            .remove(&2);
    });
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("field 2 (ready)"), "{found:?}");
    let reserved = breaks(|api| {
        let message = api.messages.get_mut(STATUS).expect("message");
        message.fields.remove(&2);
        message.reserved_numbers.push((2, 2));
        message.reserved_names.push("ready".to_owned());
    });
    assert!(reserved.is_empty(), "{reserved:?}");
}

/// Field 2 (`ready`) of `RemoteClusterStatus`.
fn ready_field(api: &mut Api) -> &mut breaking::Field {
    let message = api.messages.get_mut(STATUS).expect("message");
    message.fields.get_mut(&2).expect("field 2")
}

#[test]
fn a_renumbered_renamed_or_retyped_field_breaks() {
    let renumbered = breaks(|api| {
        let fields = &mut api.messages.get_mut(STATUS).expect("message").fields;
        let field = fields.remove(&2).expect("field 2");
        fields.insert(99, field);
    });
    assert_eq!(renumbered.len(), 1, "{renumbered:?}");
    let renamed = breaks(|api| ready_field(api).name = "is_ready".to_owned());
    assert_eq!(renamed.len(), 1, "{renamed:?}");
    let retyped = breaks(|api| ready_field(api).kind = "TYPE_STRING".to_owned());
    assert_eq!(retyped.len(), 1, "{retyped:?}");
    let repeated = breaks(|api| ready_field(api).repeated = true);
    assert_eq!(repeated.len(), 1, "{repeated:?}");
    let into_oneof = breaks(|api| ready_field(api).oneof = Some("state".to_owned()));
    assert_eq!(into_oneof.len(), 1, "{into_oneof:?}");
}

#[test]
fn a_removed_or_changed_rpc_or_service_breaks() {
    let removed = breaks(|api| {
        api.services
            .get_mut(AGENT)
            .expect("service")
            .remove("Status");
    });
    assert_eq!(removed, [format!("rpc {AGENT}.Status was removed")]);
    let changed = breaks(|api| {
        let rpc = api
            .services
            .get_mut(AGENT)
            .expect("service")
            .get_mut("Status");
        rpc.expect("Status").server_streaming = true;
    });
    assert_eq!(changed.len(), 1, "{changed:?}");
    let gone = breaks(|api| {
        api.services.remove(AGENT);
    });
    assert_eq!(gone, [format!("service {AGENT} was removed")]);
    let message_gone = breaks(|api| {
        api.messages.remove(STATUS);
    });
    assert_eq!(message_gone, [format!("message {STATUS} was removed")]);
}

#[test]
fn a_removed_or_renamed_enum_value_breaks() {
    const KIND: &str = "meshwork.agent.v1.SyncKind";
    let removed = breaks(|api| {
        api.enums.get_mut(KIND).expect("enum").values.remove(&1);
    });
    assert_eq!(removed.len(), 1, "{removed:?}");
    let renamed = breaks(|api| {
        let values = &mut api.enums.get_mut(KIND).expect("enum").values;
        values.insert(1, "SYNC_KIND_NODE".to_owned());
    });
    assert_eq!(renamed.len(), 1, "{renamed:?}");
}

#[test]
fn additions_do_not_break() {
    let old = agent_api();
    let mut new = old.clone();
    let mut extra = new.messages[STATUS].fields[&2].clone();
    // A number and a name no version has used.
    extra.name = "added_later".to_owned();
    extra.json_name = "addedLater".to_owned();
    new.messages
        .get_mut(STATUS)
        .expect("message")
        .fields
        .insert(999, extra);
    let status = new.services[AGENT]["Status"].clone();
    new.services
        .get_mut(AGENT)
        .expect("service")
        .insert("AddedLater".to_owned(), status);
    let changes = compare(&old, &new);
    assert!(changes.breaking.is_empty(), "{:?}", changes.breaking);
    assert_eq!(changes.additions.len(), 2, "{:?}", changes.additions);
}
