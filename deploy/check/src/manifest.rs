//! Rendered manifests: the objects of a multi-document YAML stream, in order, with lookups.

use serde::Deserialize as _;
use serde_json::Value;

/// Why a YAML stream could not be read as Kubernetes objects.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not YAML.
    #[error("document {index}: {error}")]
    Yaml {
        /// The document's position (from 0).
        index: usize,
        /// The parser's error.
        error: yaml_serde::Error,
    },
    /// A document without `kind` or `metadata.name`.
    #[error("document {0}: not a Kubernetes object (no kind or metadata.name)")]
    NotAnObject(usize),
}

/// One object.
#[derive(Debug, Clone)]
pub struct Object {
    /// Its position in the stream (`kubectl apply` creates in this order).
    pub index: usize,
    /// The object.
    pub value: Value,
}

impl Object {
    /// `kind`.
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `metadata.namespace`, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }

    /// `Kind/name` or `Kind/namespace/name`, as findings name it.
    pub fn id(&self) -> String {
        match self.namespace() {
            Some(namespace) => format!("{}/{namespace}/{}", self.kind(), self.name()),
            None => format!("{}/{}", self.kind(), self.name()),
        }
    }
}

/// Every object of a rendering.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    /// The objects, in order.
    pub objects: Vec<Object>,
}

impl Manifests {
    /// Reads a multi-document YAML stream (empty documents are skipped).
    pub fn parse(yaml: &str) -> Result<Self, ParseError> {
        let mut objects = Vec::new();
        for (index, document) in yaml_serde::Deserializer::from_str(yaml).enumerate() {
            let value =
                Value::deserialize(document).map_err(|error| ParseError::Yaml { index, error })?;
            if value.is_null() {
                continue;
            }
            let object = Object { index, value };
            if object.kind().is_empty() || object.name().is_empty() {
                return Err(ParseError::NotAnObject(index));
            }
            objects.push(object);
        }
        Ok(Self { objects })
    }

    /// The objects of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Object> {
        self.objects
            .iter()
            .filter(move |object| object.kind() == kind)
    }

    /// The object of `kind` named `name` in `namespace` (`None` for cluster-scoped ones).
    pub fn get(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<&Object> {
        self.objects.iter().find(|object| {
            object.kind() == kind && object.name() == name && object.namespace() == namespace
        })
    }
}
