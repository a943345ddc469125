//! Security labels and their kvstore text form (`source:key=value;` pairs sorted by key), the
//! value of an identity key.
//!
//! Facts from Cilium's `pkg/labels`: a label is `source:key=value`; `$key` and `reserved.key`
//! (no `:`) are short forms of source `reserved`; a missing source is `unspec`. The kvstore form
//! (`SortedList` / `FormatForKVStore`) writes every label as `source:key=value;` — including the
//! `=` when the value is empty — in byte order of the key, and reading it back skips entries
//! with an empty key (the text after the final `;`).

use std::fmt;

/// Source of Kubernetes-derived labels.
pub const LABEL_SOURCE_K8S: &str = "k8s";
/// Source of Cilium's reserved labels (`reserved:host`, …).
pub const LABEL_SOURCE_RESERVED: &str = "reserved";
/// Source given to a label written without one.
pub const LABEL_SOURCE_UNSPEC: &str = "unspec";
/// Label carrying the cluster name of an identity (`k8s:io.cilium.k8s.policy.cluster=<name>`).
pub const POLICY_LABEL_CLUSTER: &str = "io.cilium.k8s.policy.cluster";

/// One label: source, key and (possibly empty) value.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Label {
    // `source:key=value` in one allocation, the lengths marking the parts: remote identities
    // arrive by the ten thousand, and three strings per label cost three allocations.
    text: Box<str>,
    source_len: usize,
    key_len: usize,
}

impl Label {
    /// A label from its parts.
    pub fn new(source: &str, key: &str, value: &str) -> Self {
        let mut text = String::with_capacity(source.len() + key.len() + value.len() + 2);
        for part in [source, ":", key, "=", value] {
            text.push_str(part);
        }
        Self {
            text: text.into_boxed_str(),
            source_len: source.len(),
            key_len: key.len(),
        }
    }

    /// Where the label comes from (`k8s`, `reserved`, `cidr`, …).
    pub fn source(&self) -> &str {
        &self.text[..self.source_len]
    }

    /// The key.
    pub fn key(&self) -> &str {
        let start = self.source_len + 1;
        &self.text[start..start + self.key_len]
    }

    /// The value, empty for labels without one.
    pub fn value(&self) -> &str {
        &self.text[self.source_len + self.key_len + 2..]
    }

    /// Parses `source:key=value` with a source and a key (what a writer accepts from its
    /// clients); the error says what is missing.
    pub fn parse_strict(text: &str) -> Result<Self, &'static str> {
        let Some((source, rest)) = text.split_once(':') else {
            return Err("it has no source (source:key=value)");
        };
        let Some((key, _)) = rest.split_once('=') else {
            return Err("it has no value (source:key=value)");
        };
        if source.is_empty() || key.is_empty() {
            return Err("its source and key must not be empty (source:key=value)");
        }
        Ok(Self::parse(text))
    }

    /// Parses `source:key=value` (or the short forms) like Cilium's `ParseLabel`. Never fails;
    /// text without a key yields an empty key.
    pub fn parse(text: &str) -> Self {
        // The form the kvstore holds, `source:key=value` with a source: the text is the
        // label's text as it stands, copied once (remote identities come by the ten thousand).
        if let Some((source, rest)) = split_once(text, b':')
            && !source.is_empty()
            && !source.starts_with('$')
            && let Some((key, _)) = split_once(rest, b'=')
            && !(key.is_empty() && source == LABEL_SOURCE_RESERVED)
        {
            return Self {
                text: text.into(),
                source_len: source.len(),
                key_len: key.len(),
            };
        }
        let (source, rest) = match text.as_bytes().first() {
            None => ("", ""),
            Some(b'$') => (LABEL_SOURCE_RESERVED, &text[1..]),
            Some(_) => match split_once(text, b':') {
                Some((source, rest)) => (source, rest),
                None => match text.strip_prefix("reserved.") {
                    Some(rest) => (LABEL_SOURCE_RESERVED, rest),
                    None => ("", text),
                },
            },
        };
        let source = if source.is_empty() {
            LABEL_SOURCE_UNSPEC
        } else {
            source
        };
        let (key, value) = match split_once(rest, b'=') {
            // `reserved:=key` is a reserved key without value.
            Some(("", key)) if source == LABEL_SOURCE_RESERVED => (key, ""),
            Some((key, value)) => (key, value),
            None => (rest, ""),
        };
        Self::new(source, key, value)
    }

    /// Appends the kvstore form `source:key=value;`.
    fn write_kvstore(&self, out: &mut String) {
        out.push_str(&self.text);
        out.push(';');
    }
}

/// `text` around the first `byte` (ASCII): a plain loop, which for label-sized text costs a
/// fraction of `str::split_once`'s searcher (a profile of 40k identities showed it first).
fn split_once(text: &str, byte: u8) -> Option<(&str, &str)> {
    let at = text.bytes().position(|b| b == byte)?;
    Some((&text[..at], &text[at + 1..]))
}

impl Default for Label {
    fn default() -> Self {
        Self::new("", "", "")
    }
}

impl Ord for Label {
    /// By source, then key, then value.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.source(), self.key(), self.value()).cmp(&(other.source(), other.key(), other.value()))
    }
}

impl PartialOrd for Label {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Label")
            .field("source", &self.source())
            .field("key", &self.key())
            .field("value", &self.value())
            .finish()
    }
}

impl fmt::Display for Label {
    /// `source:key=value`, or `source:key` when the value is empty (Cilium's `String()`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source(), self.key())?;
        if !self.value().is_empty() {
            write!(f, "={}", self.value())?;
        }
        Ok(())
    }
}

/// A set of labels keyed (and ordered) by label key, like Cilium's `labels.Labels`: a key
/// appears once; inserting it again replaces the earlier label.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Labels {
    // The kvstore form (`source:key=value;` per label, in key order) in one allocation, and
    // where each label's parts lie in it (a part may hold `:`, `=` or `;`). Remote identities
    // arrive by the ten thousand with their text in this form already: it is then kept as it
    // stands, where a label of its own each cost an allocation and a copy.
    text: Box<str>,
    spans: Vec<Span>,
}

/// One label's parts in [`Labels::text`]: `source:key=value` from `start`, then `;`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: usize,
    source: usize,
    key: usize,
    value: usize,
}

impl Span {
    fn key_bytes(self, text: &str) -> &[u8] {
        let key = self.start + self.source + 1;
        &text.as_bytes()[key..key + self.key]
    }

    fn label(self, text: &str) -> LabelRef<'_> {
        let key = self.start + self.source + 1;
        let value = key + self.key + 1;
        LabelRef {
            source: &text[self.start..self.start + self.source],
            key: &text[key..key + self.key],
            value: &text[value..value + self.value],
        }
    }
}

/// A label of a [`Labels`], borrowed from it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LabelRef<'a> {
    source: &'a str,
    key: &'a str,
    value: &'a str,
}

impl<'a> LabelRef<'a> {
    /// Where the label comes from (`k8s`, `reserved`, `cidr`, …).
    pub fn source(&self) -> &'a str {
        self.source
    }

    /// The key.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The value, empty for labels without one.
    pub fn value(&self) -> &'a str {
        self.value
    }

    /// The label, owned.
    pub fn to_label(&self) -> Label {
        Label::new(self.source, self.key, self.value)
    }
}

impl PartialEq<Label> for LabelRef<'_> {
    fn eq(&self, other: &Label) -> bool {
        (self.source, self.key, self.value) == (other.source(), other.key(), other.value())
    }
}

impl fmt::Debug for LabelRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Label")
            .field("source", &self.source)
            .field("key", &self.key)
            .field("value", &self.value)
            .finish()
    }
}

impl Labels {
    /// No labels.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the kvstore form (`k8s:app=foo;k8s:io.kubernetes.pod.namespace=default;`) like
    /// Cilium's `NewLabelArrayFromSortedList`: split on `;`, entries with an empty key skipped,
    /// a repeated key keeps the last label. Never fails.
    pub fn parse_kvstore(text: &str) -> Self {
        Self::parse_canonical(text).unwrap_or_else(|| Self::parse_each(text))
    }

    /// `text` as it stands, when it is what [`Self::to_kvstore_string`] writes for the labels
    /// [`Self::parse_each`] reads from it: every entry ends in `;`, is `source:key=value` as
    /// [`Label::parse`] takes it as it stands, with a key, and the keys ascend strictly.
    /// `None` otherwise.
    fn parse_canonical(text: &str) -> Option<Self> {
        // On bytes, with memchr: the separators are ASCII, and a label-sized scan byte by
        // byte was most of an identity's decoding.
        let bytes = text.as_bytes();
        let mut spans: Vec<Span> = Vec::with_capacity(4);
        let mut start = 0;
        let mut previous: &[u8] = &[];
        while start < bytes.len() {
            let entry = &bytes[start..start + memchr::memchr(b';', &bytes[start..])?];
            let colon = memchr::memchr(b':', entry)?;
            let tail = &entry[colon + 1..];
            let equals = memchr::memchr(b'=', tail)?;
            let (source, key) = (&entry[..colon], &tail[..equals]);
            let sorted = spans.is_empty() || previous < key;
            if source.is_empty() || source[0] == b'$' || key.is_empty() || !sorted {
                return None;
            }
            previous = key;
            spans.push(Span {
                start,
                source: colon,
                key: equals,
                value: tail.len() - equals - 1,
            });
            start += entry.len() + 1;
        }
        Some(Self {
            text: text.into(),
            spans,
        })
    }

    /// The general reading: each entry through [`Label::parse`], in key order.
    fn parse_each(text: &str) -> Self {
        let mut labels = Vec::new();
        let mut rest = text;
        loop {
            let (part, next) = split_once(rest, b';').unwrap_or((rest, ""));
            // An empty part (the kvstore form ends in one) has an empty key: not parsed.
            if !part.is_empty() {
                let label = Label::parse(part);
                if !label.key().is_empty() {
                    insert_sorted(&mut labels, label);
                }
            }
            if next.is_empty() && part.len() == rest.len() {
                return Self::from_sorted(&labels);
            }
            rest = next;
        }
    }

    /// The set of `labels`, sorted by key, keys unique.
    fn from_sorted(labels: &[Label]) -> Self {
        let mut text = String::with_capacity(labels.iter().map(|l| l.text.len() + 1).sum());
        let mut spans = Vec::with_capacity(labels.len());
        for label in labels {
            spans.push(Span {
                start: text.len(),
                source: label.source_len,
                key: label.key_len,
                value: label.value().len(),
            });
            label.write_kvstore(&mut text);
        }
        Self {
            text: text.into_boxed_str(),
            spans,
        }
    }

    /// The kvstore form: every label as `source:key=value;`, sorted by key (Cilium's
    /// `SortedList`, byte for byte).
    pub fn to_kvstore_string(&self) -> String {
        self.text.to_string()
    }

    /// Adds `label`, returning the label it replaced (same key).
    pub fn insert(&mut self, label: Label) -> Option<Label> {
        let mut labels: Vec<Label> = self.iter().map(|l| l.to_label()).collect();
        let replaced = insert_sorted(&mut labels, label);
        *self = Self::from_sorted(&labels);
        replaced
    }

    /// The label with key `key`.
    pub fn get(&self, key: &str) -> Option<LabelRef<'_>> {
        // Keys compared as bytes (the order of `str`), with no slicing of the text per step.
        let at = self
            .spans
            .binary_search_by(|span| span.key_bytes(&self.text).cmp(key.as_bytes()))
            .ok()?;
        Some(self.spans[at].label(&self.text))
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl Iterator<Item = LabelRef<'_>> {
        self.spans.iter().map(|span| span.label(&self.text))
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

/// Puts `label` into `labels` (sorted by key, keys unique), returning the label it replaced.
fn insert_sorted(labels: &mut Vec<Label>, label: Label) -> Option<Label> {
    // Sorted input (the kvstore form is) appends: check the end first.
    let at = match labels.last() {
        Some(last) if last.key() < label.key() => Err(labels.len()),
        _ => labels.binary_search_by(|l| l.key().cmp(label.key())),
    };
    match at {
        Ok(at) => Some(std::mem::replace(&mut labels[at], label)),
        Err(at) => {
            labels.insert(at, label);
            None
        }
    }
}

impl FromIterator<Label> for Labels {
    fn from_iter<I: IntoIterator<Item = Label>>(iter: I) -> Self {
        let mut labels = Vec::new();
        for label in iter {
            insert_sorted(&mut labels, label);
        }
        Self::from_sorted(&labels)
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl fmt::Display for Labels {
    /// The kvstore form, see [`Labels::to_kvstore_string`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_cilium() {
        let cases = [
            ("k8s:app=foo", ("k8s", "app", "foo")),
            ("k8s:app", ("k8s", "app", "")),
            ("k8s:app=", ("k8s", "app", "")),
            ("k8s:a=b=c", ("k8s", "a", "b=c")),
            ("app=foo", ("unspec", "app", "foo")),
            ("$host", ("reserved", "host", "")),
            ("reserved.host", ("reserved", "host", "")),
            ("reserved:host", ("reserved", "host", "")),
            ("reserved:=host", ("reserved", "host", "")),
            ("cidr:10.0.0.0/8", ("cidr", "10.0.0.0/8", "")),
            (
                "k8s:io.kubernetes.pod.namespace=default",
                ("k8s", "io.kubernetes.pod.namespace", "default"),
            ),
            ("container:a:b=c", ("container", "a:b", "c")),
            ("", ("unspec", "", "")),
        ];
        for (text, (source, key, value)) in cases {
            assert_eq!(
                Label::parse(text),
                Label::new(source, key, value),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_kvstore_form_is_taken_as_it_stands() {
        // Text the fast path takes, and look-alikes it must leave to the general parse.
        for text in [
            "k8s:app=foo",
            "k8s:a=b=c",
            "container:a:b=c",
            "k8s:=v",
            "reserved:host=",
            "reserved:=host",
            "$host=x",
            ":app=foo",
            "k8s:app",
        ] {
            let label = Label::parse(text);
            let (source, key, value) = (label.source(), label.key(), label.value());
            assert_eq!(label, Label::new(source, key, value), "{text:?}");
            let general = text.split_once(':').filter(|(s, _)| !s.is_empty());
            if let Some((source_text, rest)) = general
                && !text.starts_with('$')
                && rest.contains('=')
                && !(source_text == "reserved" && rest.starts_with('='))
            {
                assert_eq!(format!("{source}:{key}={value}"), text, "{text:?}");
            }
        }
        assert_eq!(
            Label::parse("reserved:=host"),
            Label::new("reserved", "host", "")
        );
        assert_eq!(Label::parse("k8s:=v"), Label::new("k8s", "", "v"));
    }

    #[test]
    fn parts_keep_their_separators_and_order() {
        let label = Label::new("a:b", "c=d", "e;f");
        assert_eq!(
            (label.source(), label.key(), label.value()),
            ("a:b", "c=d", "e;f")
        );
        assert_ne!(Label::new("a", "b:c", ""), Label::new("a:b", "c", ""));
        // By source, then key, then value: not by the joined text, where `:` sorts first.
        assert!(Label::new("k8s", "a", "z") < Label::new("k8s:", "a", "a"));
        assert!(Label::new("k8s", "b", "") < Label::new("k8s", "b", "a"));
        let empty = Label::default();
        assert_eq!((empty.source(), empty.key(), empty.value()), ("", "", ""));
    }

    #[test]
    fn kvstore_form_round_trips_exactly() {
        // The reference example: sorted by key, every pair ends in `;`.
        let text = "k8s:app=foo;k8s:io.kubernetes.pod.namespace=default;";
        let labels = Labels::parse_kvstore(text);
        assert_eq!(labels.len(), 2);
        assert_eq!(labels.to_kvstore_string(), text);
        assert_eq!(labels.to_string(), text);

        // A value-less label keeps its `=`; the order is by key, not by source.
        let labels: Labels = [
            Label::new("reserved", "host", ""),
            Label::new("k8s", "io.cilium.k8s.policy.cluster", "c1"),
            Label::new("k8s", "Z", "upper sorts first"),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            labels.to_kvstore_string(),
            "k8s:Z=upper sorts first;reserved:host=;k8s:io.cilium.k8s.policy.cluster=c1;"
        );
        assert_eq!(Labels::parse_kvstore(&labels.to_kvstore_string()), labels);
    }

    #[test]
    fn the_kvstore_form_taken_as_it_stands_reads_as_each_label_read_alone() {
        // Entries the shortcut takes and entries it must leave to the general reading: short
        // forms, empty keys and parts, separators inside values, a reserved key without value.
        let entries = [
            "k8s:app=foo",
            "k8s:io.cilium.k8s.policy.cluster=c1",
            "unspec:a=3",
            "k8s:a=b=c",
            "container:a:b=c",
            "reserved:host=",
            "reserved:=host",
            "$host",
            "$host:x=y",
            "k8s:=v",
            "k8s:app",
            ":app=x",
            "app=foo",
            "",
            "cidr:10.0.0.0/8=",
        ];
        let mut taken = 0;
        for a in entries {
            for b in entries {
                for c in entries {
                    for end in ["", ";"] {
                        let text = format!("{a};{b};{c}{end}");
                        let labels = Labels::parse_kvstore(&text);
                        assert_eq!(labels, Labels::parse_each(&text), "{text:?}");
                        assert_eq!(
                            Labels::parse_kvstore(&labels.to_kvstore_string()),
                            labels,
                            "{text:?}"
                        );
                        if Labels::parse_canonical(&text).is_some() {
                            taken += 1;
                        }
                    }
                }
            }
        }
        // Sorted, distinct keys with the final `;`: the case remote identities arrive in.
        assert!(taken > 0, "the shortcut was never taken");
        let identity = "k8s:app=a;k8s:io.cilium.k8s.policy.cluster=c1;k8s:io.kubernetes.pod.namespace=default;";
        assert!(Labels::parse_canonical(identity).is_some());
        assert!(Labels::parse_canonical("k8s:b=1;k8s:a=2;").is_none());
        assert!(Labels::parse_canonical("k8s:a=1;k8s:a=2;").is_none());
    }

    #[test]
    fn unsorted_and_odd_input() {
        let labels = Labels::parse_kvstore("k8s:b=2;;k8s:a=1;unspec:a=3;=x;");
        assert_eq!(labels.len(), 2, "empty keys skipped, repeated key replaced");
        assert_eq!(labels.get("a").unwrap(), Label::new("unspec", "a", "3"));
        assert_eq!(labels.to_kvstore_string(), "unspec:a=3;k8s:b=2;");
        assert!(Labels::parse_kvstore("").is_empty());
        assert_eq!(Label::new("k8s", "app", "").to_string(), "k8s:app");
        assert_eq!(Label::new("k8s", "app", "x").to_string(), "k8s:app=x");
    }
}
