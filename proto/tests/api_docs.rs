//! The `.proto` files are the documented API: every file, service, RPC, message, field,
//! enum and enum value has a comment, and every RPC's comment ends with the status codes
//! it returns (`Errors: CODE …` naming only canonical gRPC codes, or `Errors: none.`).

use meshwork_proto::FILE_DESCRIPTOR_SET;
use prost::Message as _;
use prost_types::{FileDescriptorProto, FileDescriptorSet, SourceCodeInfo};

// Field numbers of descriptor.proto, which make up source-code-info paths.
const FILE_MESSAGE: i32 = 4;
const FILE_ENUM: i32 = 5;
const FILE_SERVICE: i32 = 6;
const FILE_SYNTAX: i32 = 12;
const MESSAGE_FIELD: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUM: i32 = 4;
const ENUM_VALUE: i32 = 2;
const SERVICE_METHOD: i32 = 2;

/// The canonical gRPC status code names.
const CODES: &[&str] = &[
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

fn meshwork_files() -> Vec<FileDescriptorProto> {
    let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("the compiled descriptor set");
    let files: Vec<_> = set
        .file
        .into_iter()
        .filter(|file| file.package().starts_with("meshwork."))
        .collect();
    assert!(
        !files.is_empty(),
        "no meshwork.* file in the descriptor set"
    );
    files
}

fn comment<'a>(info: &'a SourceCodeInfo, path: &[i32]) -> Option<&'a str> {
    info.location
        .iter()
        .find(|location| location.path == path)
        .and_then(|location| location.leading_comments.as_deref())
        .map(str::trim)
        .filter(|text| !text.is_empty())
}

/// Collects what lacks a comment, and the RPCs whose comment names no status codes.
struct Audit<'a> {
    info: &'a SourceCodeInfo,
    problems: Vec<String>,
}

impl Audit<'_> {
    fn require(&mut self, path: &[i32], what: impl FnOnce() -> String) -> Option<String> {
        let found = comment(self.info, path).map(str::to_owned);
        if found.is_none() {
            self.problems.push(format!("{} has no comment", what()));
        }
        found
    }

    fn message(&mut self, path: &[i32], scope: &str, message: &prost_types::DescriptorProto) {
        let name = format!("{scope}.{}", message.name());
        self.require(path, || format!("message {name}"));
        for (i, field) in message.field.iter().enumerate() {
            let field_path = [path, &[MESSAGE_FIELD, index(i)]].concat();
            self.require(&field_path, || format!("field {name}.{}", field.name()));
        }
        for (i, nested) in message.nested_type.iter().enumerate() {
            // Map entries are generated; their key and value have no source.
            if nested.options.as_ref().is_some_and(|o| o.map_entry()) {
                continue;
            }
            self.message(&[path, &[MESSAGE_NESTED, index(i)]].concat(), &name, nested);
        }
        for (i, nested) in message.enum_type.iter().enumerate() {
            self.enumeration(&[path, &[MESSAGE_ENUM, index(i)]].concat(), &name, nested);
        }
    }

    fn enumeration(
        &mut self,
        path: &[i32],
        scope: &str,
        enumeration: &prost_types::EnumDescriptorProto,
    ) {
        let name = format!("{scope}.{}", enumeration.name());
        self.require(path, || format!("enum {name}"));
        for (i, value) in enumeration.value.iter().enumerate() {
            let value_path = [path, &[ENUM_VALUE, index(i)]].concat();
            self.require(&value_path, || {
                format!("enum value {name}.{}", value.name())
            });
        }
    }

    fn rpc(&mut self, path: &[i32], name: &str) {
        let Some(text) = self.require(path, || format!("rpc {name}")) else {
            return;
        };
        if let Err(why) = error_codes(&text) {
            self.problems.push(format!("rpc {name}: {why}"));
        }
    }
}

fn index(i: usize) -> i32 {
    i32::try_from(i).expect("fewer than 2^31 elements")
}

/// The codes an RPC comment's `Errors:` paragraph names; an error when it has none, or
/// names something that is not a canonical code.
fn error_codes(comment: &str) -> Result<Vec<&str>, String> {
    let Some((_, errors)) = comment.rsplit_once("Errors:") else {
        return Err("its comment has no \"Errors:\" paragraph listing the status codes".to_owned());
    };
    if errors.trim() == "none." {
        return Ok(Vec::new());
    }
    // Each `;`-separated clause starts with the code it is about.
    let mut named = Vec::new();
    for clause in errors.split(';') {
        let code = clause.split_whitespace().next().unwrap_or_default();
        let code = code.trim_end_matches(['.', ',']);
        if !CODES.contains(&code) {
            return Err(format!(
                "the clause {:?} of its \"Errors:\" paragraph does not start with a gRPC status code",
                clause.trim()
            ));
        }
        named.push(code);
    }
    Ok(named)
}

#[test]
fn every_element_of_the_api_is_documented() {
    let mut problems = Vec::new();
    for file in meshwork_files() {
        let info = file.source_code_info.clone().unwrap_or_default();
        let mut audit = Audit {
            info: &info,
            problems: Vec::new(),
        };
        let package = file.package().to_owned();
        audit.require(&[FILE_SYNTAX], || {
            format!("file {} (above `syntax`)", file.name())
        });
        for (i, message) in file.message_type.iter().enumerate() {
            audit.message(&[FILE_MESSAGE, index(i)], &package, message);
        }
        for (i, enumeration) in file.enum_type.iter().enumerate() {
            audit.enumeration(&[FILE_ENUM, index(i)], &package, enumeration);
        }
        for (i, service) in file.service.iter().enumerate() {
            let name = format!("{package}.{}", service.name());
            audit.require(&[FILE_SERVICE, index(i)], || format!("service {name}"));
            for (j, method) in service.method.iter().enumerate() {
                let path = [FILE_SERVICE, index(i), SERVICE_METHOD, index(j)];
                audit.rpc(&path, &format!("{name}.{}", method.name()));
            }
        }
        problems.extend(
            audit
                .problems
                .into_iter()
                .map(|p| format!("{}: {p}", file.name())),
        );
    }
    assert!(
        problems.is_empty(),
        "the API documentation is incomplete:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn an_errors_paragraph_must_name_canonical_codes() {
    assert_eq!(
        error_codes("Does a thing.\n\nErrors: NOT_FOUND when absent; UNAVAILABLE otherwise."),
        Ok(vec!["NOT_FOUND", "UNAVAILABLE"])
    );
    assert_eq!(error_codes("Errors: none."), Ok(vec![]));
    assert!(error_codes("Does a thing.").is_err(), "no paragraph");
    assert!(error_codes("Errors: when it fails.").is_err(), "no code");
    assert!(
        error_codes("Errors: NOTFOUND when absent.").is_err(),
        "a misspelt code"
    );
}

#[test]
fn a_missing_comment_is_found() {
    // The negative control: the same audit over a file stripped of its comments.
    let mut file = meshwork_files().remove(0);
    let info = file.source_code_info.take().unwrap_or_default();
    let stripped = SourceCodeInfo {
        location: info
            .location
            .into_iter()
            .filter(|location| location.path != [FILE_MESSAGE, 0])
            .collect(),
    };
    let mut audit = Audit {
        info: &stripped,
        problems: Vec::new(),
    };
    audit.message(&[FILE_MESSAGE, 0], file.package(), &file.message_type[0]);
    assert_eq!(audit.problems.len(), 1, "{:?}", audit.problems);
}
