//! JSON read and written the way Go's `encoding/json` does, so Cilium agents and Meshwork agree
//! byte for byte on what is in the kvstore.
//!
//! Reading (what Go does, and so what we do):
//! - object keys match struct fields by exact name first, then case-insensitively, where the fold
//!   is Go's: ASCII case plus `ſ` (U+017F) ~ `S`, Kelvin sign `K` (U+212A) ~ `K`, and `ı`/`İ` ~ `I`
//!   (Go folds non-ASCII runes with `ToUpper(ToLower(r))`); `{"name":"n1"}` is a valid node;
//! - unknown keys are skipped;
//! - a repeated key overwrites the earlier value (last wins);
//! - `null` leaves a string, number, bool or struct field untouched and sets a slice, map or
//!   pointer field to nil (empty / `None`); a whole document `null` is the zero value.
//!
//! Writing: fields in declaration order under their Go names; `net.IP` as its text (`""` when
//! nil); `[]byte` / `net.IPMask` as padded base64 (`null` when nil); nil slices and maps as
//! `null`; `omitempty` fields skipped when empty; map keys sorted; and strings escaped like Go
//! (`<`, `>`, `&`, U+2028, U+2029 as `\u00XX` / `\u20XX`) — see [`GoFormatter`].
//!
//! Structs declare their fields once with the crate-internal `go_struct!` macro, which
//! generates a hand-rolled `Serialize` (Go names) and a `Deserialize` that walks the JSON object
//! once, matching keys without allocating. Each field names a `Codec` that says how Go encodes
//! that field's Go type.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::net::IpAddr;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};

use super::base64;
use super::net::{IpMask, go_ip_normalize, parse_go_ip};

/// Reads `bytes` as `T`, checking UTF-8 once for the whole value: serde_json's slice reader
/// checks every string it reads, a node's 38 of them each with its own call (a fifth of a
/// node's decoding, callgrind). Valid UTF-8 reads the same through the text reader; anything
/// else goes through the slice reader, whose error is the one the caller always got.
pub(crate) fn from_json_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

// ---------------------------------------------------------------------------------------------
// Field-name matching
// ---------------------------------------------------------------------------------------------

/// Whether JSON key `key` matches the Go field name `name` under Go's case folding.
///
/// `name` must be ASCII (all Cilium field names are); a key character that does not fold to
/// ASCII therefore never matches.
pub(crate) fn fold_eq(key: &str, name: &str) -> bool {
    if key.is_ascii() {
        return key.eq_ignore_ascii_case(name);
    }
    let mut name = name.bytes();
    for c in key.chars() {
        let folded = match c {
            'ſ' => b'S',
            '\u{212A}' => b'K',
            'ı' | 'İ' => b'I',
            c if c.is_ascii() => (c as u8).to_ascii_uppercase(),
            _ => return false,
        };
        match name.next() {
            Some(b) if b.to_ascii_uppercase() == folded => {}
            _ => return false,
        }
    }
    name.next().is_none()
}

/// Finds the field for `key`: an exact match wins over a case-folded one, as in Go.
pub fn lookup_field<F: Copy>(fields: &[(&str, F)], key: &str) -> Option<F> {
    fields
        .iter()
        .find(|(name, _)| *name == key)
        .or_else(|| fields.iter().find(|(name, _)| fold_eq(key, name)))
        .map(|&(_, field)| field)
}

/// Deserializes one object key into the matching field tag (`None` for an unknown key) without
/// allocating: the key is compared while it is borrowed from the input. `exact` is the exact
/// match, a `match` on the names that [`go_struct!`] writes (compiled to compares of known
/// lengths: a loop over the table called `memcmp` per field, the most of a node's key
/// lookups); the table serves the case-folded match.
#[derive(Clone, Copy)]
pub(crate) struct FieldSeed<F: 'static> {
    pub fields: &'static [(&'static str, F)],
    pub exact: fn(&str) -> Option<F>,
}

impl<'de, F: Copy + 'static> DeserializeSeed<'de> for FieldSeed<F> {
    type Value = Option<F>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, F: Copy + 'static> Visitor<'de> for FieldSeed<F> {
    type Value = Option<F>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok((self.exact)(key).or_else(|| {
            self.fields
                .iter()
                .find(|(name, _)| fold_eq(key, name))
                .map(|&(_, field)| field)
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Codecs: how Go encodes one field's Go type
// ---------------------------------------------------------------------------------------------

/// How one struct field of Rust type `T` is written and read, mirroring the Go type it stands
/// for. Used by [`go_struct!`]; a field without `as Codec` uses [`Plain`].
pub(crate) trait Codec<T> {
    /// The Go field is tagged `json:",omitempty"`: skip it when [`Codec::is_empty`].
    const OMIT_EMPTY: bool = false;

    /// Writes the value.
    fn encode<S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error>;

    /// Reads the value; `Ok(None)` means "JSON `null`, leave the field as it is".
    fn decode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error>;

    /// Go's notion of empty for `omitempty`.
    fn is_empty(value: &T) -> bool;
}

/// Go's zero/empty test behind `omitempty`: `""`, `0`, `false`, nil or empty slices and maps,
/// nil pointers. Structs are never empty (Go ignores `omitempty` on struct fields).
pub(crate) trait GoZero {
    /// Whether Go's `omitempty` would drop this value.
    fn is_go_zero(&self) -> bool;
}

macro_rules! go_zero_by {
    ($($ty:ty => |$v:ident| $e:expr),* $(,)?) => {
        $(impl GoZero for $ty {
            fn is_go_zero(&self) -> bool {
                let $v = self;
                $e
            }
        })*
    };
}

go_zero_by! {
    String => |v| v.is_empty(),
    bool => |v| !*v,
    u8 => |v| *v == 0,
    u16 => |v| *v == 0,
    u32 => |v| *v == 0,
    u64 => |v| *v == 0,
    i32 => |v| *v == 0,
    i64 => |v| *v == 0,
}

impl<T> GoZero for Vec<T> {
    fn is_go_zero(&self) -> bool {
        self.is_empty()
    }
}

impl<K, V> GoZero for BTreeMap<K, V> {
    fn is_go_zero(&self) -> bool {
        self.is_empty()
    }
}

impl<T> GoZero for Option<T> {
    fn is_go_zero(&self) -> bool {
        self.is_none()
    }
}

/// Serde's own encoding; `null` leaves the field untouched. For Go strings, numbers, bools,
/// structs, pointers (`Option`) and maps that Go always allocates (empty encodes as `{}`).
pub(crate) struct Plain;

impl<T: Serialize + DeserializeOwned + GoZero> Codec<T> for Plain {
    fn encode<S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
        value.serialize(serializer)
    }

    fn decode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        Option::<T>::deserialize(deserializer)
    }

    fn is_empty(value: &T) -> bool {
        value.is_go_zero()
    }
}

/// A Go slice or map that is usually nil when empty: empty encodes as `null`, `null` decodes
/// as empty.
pub(crate) struct NullIfEmpty;

impl<T: Serialize + DeserializeOwned + GoZero + Default> Codec<T> for NullIfEmpty {
    fn encode<S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
        if value.is_go_zero() {
            serializer.serialize_none()
        } else {
            value.serialize(serializer)
        }
    }

    fn decode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        Ok(Some(
            Option::<T>::deserialize(deserializer)?.unwrap_or_default(),
        ))
    }

    fn is_empty(value: &T) -> bool {
        value.is_go_zero()
    }
}

/// Adds Go's `omitempty` to codec `C`.
pub(crate) struct OmitEmpty<C>(PhantomData<C>);

impl<T, C: Codec<T>> Codec<T> for OmitEmpty<C> {
    const OMIT_EMPTY: bool = true;

    fn encode<S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
        C::encode(value, serializer)
    }

    fn decode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
        C::decode(deserializer)
    }

    fn is_empty(value: &T) -> bool {
        C::is_empty(value)
    }
}

/// Go's `net.IP` (a byte slice with text marshalling): `None` encodes as `""`; `""` and `null`
/// decode as `None`; an IPv4-mapped IPv6 address reads and writes as IPv4, as in Go.
pub(crate) struct GoIp;

impl Codec<Option<IpAddr>> for GoIp {
    fn encode<S: Serializer>(value: &Option<IpAddr>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            None => serializer.serialize_str(""),
            Some(ip) => serializer.collect_str(&go_ip_normalize(*ip)),
        }
    }

    fn decode<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<IpAddr>>, D::Error> {
        struct IpVisitor;
        impl Visitor<'_> for IpVisitor {
            type Value = Option<IpAddr>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an IP address string")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                if text.is_empty() {
                    return Ok(None);
                }
                parse_go_ip(text)
                    .map(Some)
                    .ok_or_else(|| E::custom(format_args!("invalid IP address: {text:?}")))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
        }
        deserializer.deserialize_any(IpVisitor).map(Some)
    }

    fn is_empty(value: &Option<IpAddr>) -> bool {
        value.is_none()
    }
}

/// Go's `net.IPMask` (a `[]byte`): base64 text, `null` when nil.
pub(crate) struct GoMask;

impl Codec<Option<IpMask>> for GoMask {
    fn encode<S: Serializer>(value: &Option<IpMask>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            None => serializer.serialize_none(),
            Some(mask) => serializer.serialize_str(&base64::encode(mask.as_bytes())),
        }
    }

    fn decode<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Option<IpMask>>, D::Error> {
        struct MaskVisitor;
        impl Visitor<'_> for MaskVisitor {
            type Value = Option<IpMask>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a base64-encoded IP mask")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                let bytes = base64::decode(text).ok_or_else(|| {
                    E::custom(format_args!("illegal base64 data in mask: {text:?}"))
                })?;
                IpMask::from_bytes(&bytes).map(Some).ok_or_else(|| {
                    E::custom(format_args!(
                        "mask of {} bytes is longer than 16",
                        bytes.len()
                    ))
                })
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
        }
        deserializer.deserialize_any(MaskVisitor).map(Some)
    }

    fn is_empty(value: &Option<IpMask>) -> bool {
        value.is_none_or(|mask| mask.as_bytes().is_empty())
    }
}

/// Serializes one field through its codec.
pub(crate) struct Encode<'a, C, T>(&'a T, PhantomData<fn() -> C>);

impl<'a, C, T> Encode<'a, C, T> {
    pub(crate) fn new(value: &'a T) -> Self {
        Self(value, PhantomData)
    }
}

impl<C: Codec<T>, T> Serialize for Encode<'_, C, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        C::encode(self.0, serializer)
    }
}

/// Deserializes one field's value through its codec.
pub(crate) struct DecodeSeed<C, T>(PhantomData<fn() -> (C, T)>);

impl<C, T> DecodeSeed<C, T> {
    pub(crate) fn new() -> Self {
        Self(PhantomData)
    }
}

impl<'de, C: Codec<T>, T> DeserializeSeed<'de> for DecodeSeed<C, T> {
    type Value = Option<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        C::decode(deserializer)
    }
}

// ---------------------------------------------------------------------------------------------
// The struct macro
// ---------------------------------------------------------------------------------------------

/// Picks the field codec: the one named after `as`, else [`Plain`].
macro_rules! go_codec {
    () => {
        $crate::go_json::Plain
    };
    ($codec:ty) => {
        $codec
    };
}
pub(crate) use go_codec;

/// Declares a struct that Go wrote: each field once, with its Go JSON name and optionally the
/// codec of its Go type.
///
/// ```ignore
/// go_struct! {
///     /// A named port.
///     pub struct NamedPort {
///         /// Port name.
///         pub name: String => "Name",
///         /// Kubernetes namespace; `json:",omitempty"`.
///         pub namespace: String => "K8sNamespace" as OmitEmpty<Plain>,
///         /// Host IP (`net.IP`).
///         pub host_ip: Option<IpAddr> => "HostIP" as GoIp,
///     }
/// }
/// ```
///
/// Generates the struct (deriving `Debug, Clone, PartialEq, Eq, Default`), `to_json` /
/// `from_json`, a `Serialize` writing the Go names in declaration order, and a `Deserialize`
/// with Go's reading rules (see the module docs). Every field type must implement `Default`.
macro_rules! go_struct {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $fvis:vis $field:ident : $fty:ty => $go:literal $(as $codec:ty)?
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        $vis struct $name {
            $( $(#[$fmeta])* $fvis $field: $fty, )+
        }

        #[allow(dead_code)]
        impl $name {
            /// The Go field names, in declaration order.
            pub(crate) const GO_FIELDS: &'static [&'static str] = &[$($go),+];

            /// Encodes as Go's `encoding/json` does: Go field names, Go's value formats.
            pub fn to_json(&self) -> Vec<u8> {
                $crate::go_json::to_vec(self).expect("Go-shaped structs always encode")
            }

            /// Decodes as Go's `encoding/json` does (case-insensitive names, unknown fields
            /// ignored, last duplicate wins, `null` leaves the zero value).
            pub fn from_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
                $crate::go_json::from_json_bytes(bytes)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeStruct as _;
                use $crate::go_json::{Codec, Encode};
                const FIELD_COUNT: usize = [$($go),+].len();
                let mut st = serializer.serialize_struct(stringify!($name), FIELD_COUNT)?;
                $({
                    type FieldCodec = $crate::go_json::go_codec!($($codec)?);
                    if <FieldCodec as Codec<$fty>>::OMIT_EMPTY
                        && <FieldCodec as Codec<$fty>>::is_empty(&self.$field)
                    {
                        st.skip_field($go)?;
                    } else {
                        st.serialize_field($go, &Encode::<FieldCodec, $fty>::new(&self.$field))?;
                    }
                })+
                st.end()
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                use $crate::go_json::{DecodeSeed, FieldSeed};

                #[allow(non_camel_case_types)]
                #[derive(Clone, Copy)]
                enum FieldTag { $($field),+ }
                const FIELDS: &[(&str, FieldTag)] = &[$(($go, FieldTag::$field)),+];
                fn exact(key: &str) -> Option<FieldTag> {
                    match key {
                        $($go => Some(FieldTag::$field),)+
                        _ => None,
                    }
                }

                struct StructVisitor;
                impl<'de> serde::de::Visitor<'de> for StructVisitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str(concat!("a JSON object (", stringify!($name), ")"))
                    }

                    // Go: `null` unmarshals into a struct as a no-op.
                    fn visit_unit<E: serde::de::Error>(self) -> Result<$name, E> {
                        Ok(<$name>::default())
                    }

                    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut out = <$name>::default();
                        let seed = FieldSeed { fields: FIELDS, exact };
                        while let Some(tag) = map.next_key_seed(seed)? {
                            match tag {
                                $(Some(FieldTag::$field) => {
                                    type FieldCodec = $crate::go_json::go_codec!($($codec)?);
                                    let seed = DecodeSeed::<FieldCodec, $fty>::new();
                                    if let Some(value) = map.next_value_seed(seed)? {
                                        out.$field = value;
                                    }
                                })+
                                None => {
                                    map.next_value::<serde::de::IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(out)
                    }
                }

                deserializer.deserialize_any(StructVisitor)
            }
        }

        impl $crate::go_json::GoZero for $name {
            fn is_go_zero(&self) -> bool {
                false
            }
        }
    };
}
pub(crate) use go_struct;

/// Declares a Go string type with well-known values (`type AddressType string`): one variant
/// per known value plus `Other(String)` so that unknown values survive a round trip. The zero
/// value is `Other("")`, Go's `""`.
macro_rules! go_string_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// Any other value, kept verbatim.
            Other(String),
        }

        impl $name {
            /// The Go string value.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Other(text) => text,
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::Other(String::new())
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                match text {
                    $( $text => Self::$variant, )+
                    other => Self::Other(other.to_owned()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct TextVisitor;
                impl serde::de::Visitor<'_> for TextVisitor {
                    type Value = $name;

                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str("a string")
                    }

                    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<$name, E> {
                        Ok($name::from(text))
                    }
                }
                deserializer.deserialize_str(TextVisitor)
            }
        }

        impl $crate::go_json::GoZero for $name {
            fn is_go_zero(&self) -> bool {
                self.as_str().is_empty()
            }
        }
    };
}
pub(crate) use go_string_enum;

// ---------------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------------

/// A `serde_json` formatter that escapes strings exactly like Go's `json.Marshal`: on top of
/// what `serde_json` escapes (quote, backslash, control characters — same forms as Go), Go
/// escapes `<`, `>`, `&` and U+2028 / U+2029 (HTML safety).
#[derive(Debug, Clone, Copy, Default)]
pub struct GoFormatter;

impl serde_json::ser::Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let bytes = fragment.as_bytes();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            let (escape, width): (&[u8], usize) = match bytes[i] {
                b'<' => (b"\\u003c", 1),
                b'>' => (b"\\u003e", 1),
                b'&' => (b"\\u0026", 1),
                // U+2028 and U+2029 are E2 80 A8 / E2 80 A9 in UTF-8.
                0xE2 if bytes.get(i + 1) == Some(&0x80) && bytes.get(i + 2) == Some(&0xA8) => {
                    (b"\\u2028", 3)
                }
                0xE2 if bytes.get(i + 1) == Some(&0x80) && bytes.get(i + 2) == Some(&0xA9) => {
                    (b"\\u2029", 3)
                }
                _ => {
                    i += 1;
                    continue;
                }
            };
            writer.write_all(&bytes[start..i])?;
            writer.write_all(escape)?;
            i += width;
            start = i;
        }
        writer.write_all(&bytes[start..])
    }
}

/// Serializes `value` to JSON with [`GoFormatter`], i.e. the bytes Go's `json.Marshal` produces
/// for the equivalent Go value.
pub fn to_vec<T: ?Sized + Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(128);
    value.serialize(&mut serde_json::Serializer::with_formatter(
        &mut out,
        GoFormatter,
    ))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    go_struct! {
        /// Exercises every codec.
        struct Sample {
            name: String => "Name",
            count: u32 => "Count",
            list: Vec<String> => "List" as NullIfEmpty,
            made: BTreeMap<String, String> => "Made",
            skipped: String => "Skipped" as OmitEmpty<Plain>,
            ip: Option<IpAddr> => "IP" as GoIp,
            mask: Option<IpMask> => "Mask" as GoMask,
            inner: Option<Inner> => "Inner",
        }
    }

    go_struct! {
        struct Inner {
            flag: bool => "flag" as OmitEmpty<Plain>,
            value: u8 => "value",
        }
    }

    fn sample(json: &str) -> Sample {
        Sample::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn folds_like_go() {
        assert!(fold_eq("name", "Name"));
        assert!(fold_eq("NAME", "Name"));
        assert!(fold_eq("ipv4alloccidr", "IPv4AllocCIDR"));
        assert!(fold_eq("ſtate", "State"), "long s folds to S");
        assert!(fold_eq("\u{212A}ey", "Key"), "Kelvin sign folds to K");
        assert!(
            fold_eq("ıp", "IP") && fold_eq("İP", "IP"),
            "Go folds dotless/dotted i to I"
        );
        assert!(!fold_eq("nam", "Name"));
        assert!(!fold_eq("namé", "Name"));
        assert!(!fold_eq("Names", "Name"));
    }

    #[test]
    fn exact_match_wins_over_fold() {
        let fields = [("name", 1), ("Name", 2)];
        assert_eq!(lookup_field(&fields, "Name"), Some(2));
        assert_eq!(lookup_field(&fields, "name"), Some(1));
        assert_eq!(
            lookup_field(&fields, "NAME"),
            Some(1),
            "first folded match, as Go"
        );
        assert_eq!(lookup_field(&fields, "other"), None);
    }

    #[test]
    fn encodes_like_go() {
        let value = Sample {
            name: "a<b>&c\u{2028}\n".into(),
            count: 7,
            ip: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
            ..Sample::default()
        };
        let expected = r#"{"Name":"a\u003cb\u003e\u0026c\u2028\n","Count":7,"List":null,"Made":{},"IP":"10.0.0.1","Mask":null,"Inner":null}"#;
        assert_eq!(String::from_utf8(value.to_json()).unwrap(), expected);

        let empty = r#"{"Name":"","Count":0,"List":null,"Made":{},"IP":"","Mask":null,"Inner":{"value":0}}"#;
        let value = Sample {
            inner: Some(Inner::default()),
            ..Sample::default()
        };
        assert_eq!(String::from_utf8(value.to_json()).unwrap(), empty);
    }

    #[test]
    fn reads_like_go() {
        let value = sample(
            r#"{"name":"x","COUNT":3,"list":["a"],"made":{"k":"v"},"skipped":"s","ip":"::ffff:10.0.0.1",
                "mask":"////AA==","inner":{"FLAG":true,"Value":9},"unknown":{"deep":[1,2,{"x":null}]}}"#,
        );
        assert_eq!(value.name, "x");
        assert_eq!(value.count, 3);
        assert_eq!(value.list, ["a"]);
        assert_eq!(value.made.get("k").map(String::as_str), Some("v"));
        assert_eq!(value.skipped, "s");
        assert_eq!(
            value.ip,
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))),
            "v4-mapped reads as IPv4"
        );
        assert_eq!(value.mask.unwrap().as_bytes(), [255, 255, 255, 0]);
        assert_eq!(
            value.inner,
            Some(Inner {
                flag: true,
                value: 9
            })
        );
    }

    #[test]
    fn null_and_duplicates() {
        // null on a string/number keeps the earlier value; on a slice/map it clears it.
        let value = sample(
            r#"{"Name":"a","Name":null,"Count":1,"Count":2,"List":["x"],"List":null,"IP":"1.2.3.4","IP":null}"#,
        );
        assert_eq!(value.name, "a");
        assert_eq!(value.count, 2);
        assert!(value.list.is_empty());
        assert_eq!(value.ip, None);
        assert_eq!(sample("null"), Sample::default());
        assert_eq!(sample(r#"{"Name":"first","name":"second"}"#).name, "second");
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            r#"{"Count":-1}"#,
            r#"{"Count":1.5}"#,
            r#"{"Count":"1"}"#,
            r#"{"IP":"10.0.0.256"}"#,
            r#"{"IP":"fe80::1%eth0"}"#,
            r#"{"Mask":"not base64"}"#,
            r#"{"Inner":{"value":256}}"#,
            r#"[]"#,
        ] {
            assert!(Sample::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
