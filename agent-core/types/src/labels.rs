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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Labels(
    // Sorted by key, keys unique. A set holds a handful of labels: a sorted vector costs one
    // allocation where a map costs a node and a copy of every key, and remote identities
    // arrive by the ten thousand.
    Vec<Label>,
);

impl Labels {
    /// No labels.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the kvstore form (`k8s:app=foo;k8s:io.kubernetes.pod.namespace=default;`) like
    /// Cilium's `NewLabelArrayFromSortedList`: split on `;`, entries with an empty key skipped,
    /// a repeated key keeps the last label. Never fails.
    pub fn parse_kvstore(text: &str) -> Self {
        // One allocation for the set: a label per `;` at most (the text after the last is
        // empty in the kvstore form, and skipped).
        let mut labels = Self(Vec::with_capacity(
            text.bytes().filter(|&b| b == b';').count().max(1),
        ));
        let mut rest = text;
        loop {
            let (part, next) = split_once(rest, b';').unwrap_or((rest, ""));
            // An empty part (the kvstore form ends in one) has an empty key: not parsed.
            if !part.is_empty() {
                let label = Label::parse(part);
                if !label.key().is_empty() {
                    labels.insert(label);
                }
            }
            if next.is_empty() && part.len() == rest.len() {
                return labels;
            }
            rest = next;
        }
    }

    /// The kvstore form: every label as `source:key=value;`, sorted by key (Cilium's
    /// `SortedList`, byte for byte).
    pub fn to_kvstore_string(&self) -> String {
        let mut out = String::with_capacity(self.0.iter().map(|l| l.text.len() + 1).sum());
        for label in &self.0 {
            label.write_kvstore(&mut out);
        }
        out
    }

    /// Adds `label`, returning the label it replaced (same key).
    pub fn insert(&mut self, label: Label) -> Option<Label> {
        match self.position(label.key()) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at], label)),
            Err(at) => {
                self.0.insert(at, label);
                None
            }
        }
    }

    /// The label with key `key`.
    pub fn get(&self, key: &str) -> Option<&Label> {
        self.position(key).ok().map(|at| &self.0[at])
    }

    /// The labels in key order.
    pub fn iter(&self) -> impl Iterator<Item = &Label> {
        self.0.iter()
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn position(&self, key: &str) -> Result<usize, usize> {
        // Sorted input (the kvstore form is) appends: check the end first.
        match self.0.last() {
            Some(last) if last.key() < key => Err(self.0.len()),
            _ => self.0.binary_search_by(|label| label.key().cmp(key)),
        }
    }
}

impl FromIterator<Label> for Labels {
    fn from_iter<I: IntoIterator<Item = Label>>(iter: I) -> Self {
        let mut labels = Self::new();
        for label in iter {
            labels.insert(label);
        }
        labels
    }
}

impl fmt::Display for Labels {
    /// The kvstore form, see [`Labels::to_kvstore_string`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_kvstore_string())
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
    fn unsorted_and_odd_input() {
        let labels = Labels::parse_kvstore("k8s:b=2;;k8s:a=1;unspec:a=3;=x;");
        assert_eq!(labels.len(), 2, "empty keys skipped, repeated key replaced");
        assert_eq!(labels.get("a"), Some(&Label::new("unspec", "a", "3")));
        assert_eq!(labels.to_kvstore_string(), "unspec:a=3;k8s:b=2;");
        assert!(Labels::parse_kvstore("").is_empty());
        assert_eq!(Label::new("k8s", "app", "").to_string(), "k8s:app");
        assert_eq!(Label::new("k8s", "app", "x").to_string(), "k8s:app=x");
    }
}
