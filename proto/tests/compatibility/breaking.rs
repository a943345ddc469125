//! What an existing client can see of a package, and which changes to it break that client,
//! after `buf breaking`'s wire and JSON rules: a removed service, RPC, message, field, enum
//! or enum value (unless its number and name are reserved), a renumbered or renamed field
//! or value, a changed field type, label or oneof, a changed RPC request, response or
//! streaming. Everything new is an addition.

use std::collections::BTreeMap;

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};

/// One package's services, messages and enums, by full name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Api {
    pub services: BTreeMap<String, BTreeMap<String, Rpc>>,
    pub messages: BTreeMap<String, Message>,
    pub enums: BTreeMap<String, Enum>,
}

/// An RPC's signature.
#[derive(Debug, Clone, PartialEq)]
pub struct Rpc {
    pub input: String,
    pub output: String,
    pub client_streaming: bool,
    pub server_streaming: bool,
}

/// A message's fields by number, and what it reserves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    pub fields: BTreeMap<i32, Field>,
    pub reserved_numbers: Vec<(i32, i32)>,
    pub reserved_names: Vec<String>,
}

/// What the wire and JSON see of a field.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub json_name: String,
    pub repeated: bool,
    pub kind: String,
    pub oneof: Option<String>,
}

/// An enum's values by number, and what it reserves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Enum {
    pub values: BTreeMap<i32, String>,
    pub reserved_numbers: Vec<(i32, i32)>,
    pub reserved_names: Vec<String>,
}

impl Api {
    /// The part of `set` in `package`.
    pub fn of(set: &FileDescriptorSet, package: &str) -> Self {
        let mut api = Api::default();
        for file in set.file.iter().filter(|f| f.package() == package) {
            for message in &file.message_type {
                api.add_message(package, message);
            }
            for enumeration in &file.enum_type {
                api.add_enum(package, enumeration);
            }
            for service in &file.service {
                let rpcs = service
                    .method
                    .iter()
                    .map(|m| {
                        let rpc = Rpc {
                            input: m.input_type().to_owned(),
                            output: m.output_type().to_owned(),
                            client_streaming: m.client_streaming(),
                            server_streaming: m.server_streaming(),
                        };
                        (m.name().to_owned(), rpc)
                    })
                    .collect();
                api.services
                    .insert(format!("{package}.{}", service.name()), rpcs);
            }
        }
        api
    }

    fn add_message(&mut self, scope: &str, message: &DescriptorProto) {
        let name = format!("{scope}.{}", message.name());
        for nested in &message.nested_type {
            self.add_message(&name, nested);
        }
        for enumeration in &message.enum_type {
            self.add_enum(&name, enumeration);
        }
        let fields = message
            .field
            .iter()
            .map(|f| (f.number(), field(message, f)))
            .collect();
        self.messages.insert(
            name,
            Message {
                fields,
                reserved_numbers: message
                    .reserved_range
                    .iter()
                    // Message ranges are end-exclusive.
                    .map(|r| (r.start(), r.end() - 1))
                    .collect(),
                reserved_names: message.reserved_name.clone(),
            },
        );
    }

    fn add_enum(&mut self, scope: &str, enumeration: &EnumDescriptorProto) {
        self.enums.insert(
            format!("{scope}.{}", enumeration.name()),
            Enum {
                values: enumeration
                    .value
                    .iter()
                    .map(|v| (v.number(), v.name().to_owned()))
                    .collect(),
                // Enum ranges are end-inclusive.
                reserved_numbers: enumeration
                    .reserved_range
                    .iter()
                    .map(|r| (r.start(), r.end()))
                    .collect(),
                reserved_names: enumeration.reserved_name.clone(),
            },
        );
    }
}

fn field(message: &DescriptorProto, f: &FieldDescriptorProto) -> Field {
    // A proto3 `optional` is a synthetic oneof: not a oneof a client can see.
    let oneof = f
        .oneof_index
        .filter(|_| !f.proto3_optional())
        .and_then(|i| message.oneof_decl.get(usize::try_from(i).ok()?))
        .map(|o| o.name().to_owned());
    let kind = match f.r#type() {
        Type::Message | Type::Enum | Type::Group => f.type_name().to_owned(),
        scalar => scalar.as_str_name().to_owned(),
    };
    Field {
        name: f.name().to_owned(),
        json_name: f.json_name().to_owned(),
        repeated: f.label() == Label::Repeated,
        kind,
        oneof,
    }
}

/// What changed between two versions of a package.
#[derive(Debug, Default)]
pub struct Changes {
    /// Changes that break an existing client.
    pub breaking: Vec<String>,
    /// Things that are new.
    pub additions: Vec<String>,
}

fn reserved(numbers: &[(i32, i32)], names: &[String], number: i32, name: &str) -> bool {
    numbers.iter().any(|(lo, hi)| (*lo..=*hi).contains(&number)) && names.iter().any(|n| n == name)
}

/// Compares `new` against `old`.
pub fn compare(old: &Api, new: &Api) -> Changes {
    let mut changes = Changes::default();
    let Changes {
        breaking,
        additions,
    } = &mut changes;
    for (service, old_rpcs) in &old.services {
        let Some(new_rpcs) = new.services.get(service) else {
            breaking.push(format!("service {service} was removed"));
            continue;
        };
        for (name, old_rpc) in old_rpcs {
            match new_rpcs.get(name) {
                None => breaking.push(format!("rpc {service}.{name} was removed")),
                Some(new_rpc) if new_rpc != old_rpc => breaking.push(format!(
                    "rpc {service}.{name} changed its signature: {old_rpc:?} → {new_rpc:?}"
                )),
                Some(_) => {}
            }
        }
        for name in new_rpcs.keys().filter(|n| !old_rpcs.contains_key(*n)) {
            additions.push(format!("rpc {service}.{name}"));
        }
    }
    for (name, old_message) in &old.messages {
        let Some(new_message) = new.messages.get(name) else {
            breaking.push(format!("message {name} was removed"));
            continue;
        };
        for (number, old_field) in &old_message.fields {
            let what = format!("field {number} ({}) of {name}", old_field.name);
            match new_message.fields.get(number) {
                None if reserved(
                    &new_message.reserved_numbers,
                    &new_message.reserved_names,
                    *number,
                    &old_field.name,
                ) => {}
                None => breaking.push(format!(
                    "{what} was removed without reserving its number and name"
                )),
                Some(new_field) if new_field != old_field => {
                    breaking.push(format!("{what} changed: {old_field:?} → {new_field:?}"));
                }
                Some(_) => {}
            }
        }
        for (number, field) in &new_message.fields {
            if !old_message.fields.contains_key(number) {
                additions.push(format!("field {number} ({}) of {name}", field.name));
            }
        }
    }
    for (name, old_enum) in &old.enums {
        let Some(new_enum) = new.enums.get(name) else {
            breaking.push(format!("enum {name} was removed"));
            continue;
        };
        for (number, old_value) in &old_enum.values {
            match new_enum.values.get(number) {
                None if reserved(
                    &new_enum.reserved_numbers,
                    &new_enum.reserved_names,
                    *number,
                    old_value,
                ) => {}
                None => breaking.push(format!(
                    "value {old_value} = {number} of {name} was removed without reserving it"
                )),
                Some(new_value) if new_value != old_value => breaking.push(format!(
                    "value {number} of {name} was renamed: {old_value} → {new_value}"
                )),
                Some(_) => {}
            }
        }
        for (number, value) in &new_enum.values {
            if !old_enum.values.contains_key(number) {
                additions.push(format!("value {value} = {number} of {name}"));
            }
        }
    }
    additions.extend(
        new.services
            .keys()
            .filter(|s| !old.services.contains_key(*s))
            .map(|s| format!("service {s}")),
    );
    additions.extend(
        new.messages
            .keys()
            .filter(|m| !old.messages.contains_key(*m))
            .map(|m| format!("message {m}")),
    );
    additions.extend(
        new.enums
            .keys()
            .filter(|e| !old.enums.contains_key(*e))
            .map(|e| format!("enum {e}")),
    );
    changes
}
