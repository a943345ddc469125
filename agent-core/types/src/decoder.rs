//! Turning a kvstore key/value pair into a typed, validated entry.

/// Decodes and validates the value stored under one key of a watched prefix.
///
/// A decoder carries the context that validation needs (the remote cluster's name and ID),
/// so that a remote can never inject entries for another cluster.
pub trait Decoder: Send + Sync + 'static {
    /// The decoded entry.
    type Value: Clone + PartialEq + Send + Sync + std::fmt::Debug + 'static;

    /// Decodes `value` found under `key`; `key` is relative to the watched prefix (the prefix
    /// and its trailing `/` removed).
    fn decode(&self, key: &str, value: &[u8]) -> Result<Self::Value, DecodeError>;

    /// Decodes `value` as written at `mod_revision` (the key's etcd mod revision). Decoders
    /// whose values carry the revision (a Kubernetes-style `resourceVersion`) override this;
    /// the rest decode as [`Decoder::decode`] does.
    fn decode_at(
        &self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
    ) -> Result<Self::Value, DecodeError> {
        let _ = mod_revision;
        self.decode(key, value)
    }
}

/// A decoded value that names the key it was stored under: its decoder accepts it under no
/// other key. A store can then keep such values without their keys (a million ipcache keys
/// are a million allocations) and render a key when it needs one.
pub trait KeyedValue {
    /// Calls `f` with the value's key, relative to the watched prefix: its UTF-8 text as
    /// bytes, so that finding a value by key costs no UTF-8 check.
    fn with_key<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R;

    /// Whether every decoder of this type accepts a value only after comparing its
    /// [`with_key`](Self::with_key) with the key it was found under. A store then need not
    /// compare them again (a million ipcache keys rendered once each, not twice); otherwise
    /// it does, and stores nothing under a key the value does not name.
    const KEY_CHECKED_BY_DECODER: bool = false;
}

/// Why an entry was rejected. The watch store logs it, counts it and keeps the old value.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The value is not the JSON (or text) the type expects.
    #[error("malformed value: {0}")]
    Malformed(String),
    /// The value decoded but breaks a validation rule.
    #[error("invalid entry: {0}")]
    Invalid(String),
}

impl From<serde_json::Error> for DecodeError {
    fn from(err: serde_json::Error) -> Self {
        Self::Malformed(err.to_string())
    }
}

/// Keeps the raw bytes of every value: for canaries, tests and tools that need no type.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Value = Vec<u8>;

    fn decode(&self, _key: &str, value: &[u8]) -> Result<Self::Value, DecodeError> {
        Ok(value.to_vec())
    }
}
