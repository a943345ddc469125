//! Range reads decoded in place. etcd-client decodes a `RangeResponse` with prost into a
//! `KeyValue` per key, each key and value copied into a vector of its own: two allocations
//! and two copies per key that the caller decodes once and drops (callgrind of an agent's
//! sync: a third of its instructions). Here `/etcdserverpb.KV/Range` goes through a codec of
//! our own on the same channel: a page keeps the response as one buffer and where each key
//! and value lie in it.

use std::ops::Range;

use bytes::{Buf, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// etcd's `RangeRequest`, the fields a paginated list sets (the others keep their zero).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(int64, tag = "4")]
    pub revision: i64,
    #[prost(bool, tag = "7")]
    pub serializable: bool,
}

/// One key of a [`ListPage`], borrowed from it: etcd's `mvccpb.KeyValue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyValueRef<'a> {
    key: &'a [u8],
    value: &'a [u8],
    span: &'a Span,
}

impl<'a> KeyValueRef<'a> {
    /// The key.
    pub fn key(&self) -> &'a [u8] {
        self.key
    }

    /// The key as text (etcd keys may be any bytes).
    pub fn key_str(&self) -> Result<&'a str, std::str::Utf8Error> {
        std::str::from_utf8(self.key)
    }

    /// The value.
    pub fn value(&self) -> &'a [u8] {
        self.value
    }

    /// The revision of the key's last change.
    pub fn mod_revision(&self) -> i64 {
        self.span.mod_revision
    }

    /// The revision the key was created at.
    pub fn create_revision(&self) -> i64 {
        self.span.create_revision
    }

    /// Changes since its creation.
    pub fn version(&self) -> i64 {
        self.span.version
    }

    /// The lease the key is attached to (0: none).
    pub fn lease(&self) -> i64 {
        self.span.lease
    }
}

/// Where one key/value lies in its page's buffer, with its numbers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Span {
    key: Range<u32>,
    value: Range<u32>,
    create_revision: i64,
    mod_revision: i64,
    version: i64,
    lease: i64,
}

/// One page of a paginated list: the keys of one range response, in key order.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    buffer: Bytes,
    spans: Vec<Span>,
    /// The revision the whole list reads at.
    pub revision: i64,
    /// Keys in the range from this page's first key on, this page included (etcd's
    /// `count`): on the first page, the size of the whole list.
    pub remaining: i64,
}

impl ListPage {
    /// The page's keys, in order.
    pub fn kvs(&self) -> impl DoubleEndedIterator<Item = KeyValueRef<'_>> + ExactSizeIterator {
        self.spans.iter().map(|span| self.at(span))
    }

    /// The last key of the page.
    pub fn last(&self) -> Option<KeyValueRef<'_>> {
        self.spans.last().map(|span| self.at(span))
    }

    /// Keys on the page.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the page holds no key.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn at<'a>(&'a self, span: &'a Span) -> KeyValueRef<'a> {
        let slice = |range: &Range<u32>| &self.buffer[range.start as usize..range.end as usize];
        KeyValueRef {
            key: slice(&span.key),
            value: slice(&span.value),
            span,
        }
    }

    /// A page of keys read some other way (a transaction's range): copied into one buffer.
    pub(crate) fn from_key_values(
        kvs: &[etcd_client::KeyValue],
        revision: i64,
        remaining: i64,
    ) -> Self {
        let mut buffer =
            Vec::with_capacity(kvs.iter().map(|kv| kv.key().len() + kv.value().len()).sum());
        let mut place = |bytes: &[u8]| {
            let start = offset(buffer.len());
            buffer.extend_from_slice(bytes);
            start..offset(buffer.len())
        };
        let spans = kvs
            .iter()
            .map(|kv| Span {
                key: place(kv.key()),
                value: place(kv.value()),
                create_revision: kv.create_revision(),
                mod_revision: kv.mod_revision(),
                version: kv.version(),
                lease: kv.lease(),
            })
            .collect();
        Self {
            buffer: buffer.into(),
            spans,
            revision,
            remaining,
        }
    }
}

/// Offsets fit: a response is capped far below 4 GiB by the decode limit.
fn offset(position: usize) -> u32 {
    u32::try_from(position).expect("a range response is smaller than 4 GiB")
}

/// A decoded `RangeResponse`: the page, the header's revision and `more`.
#[derive(Debug)]
pub(crate) struct RangeResponse {
    pub page: ListPage,
    pub more: bool,
}

/// Why a response could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed RangeResponse: {0}")]
pub(crate) struct MalformedResponse(&'static str);

impl RangeResponse {
    /// Reads `buffer`, a protobuf `etcdserverpb.RangeResponse`, as prost would: fields in any
    /// order, unknown ones skipped, a repeated scalar field's last value kept.
    /// `expected` is how many keys were asked for: the page is made that size at once
    /// (bounded by what the buffer can hold: an entry takes two bytes at least).
    pub(crate) fn parse(buffer: Bytes, expected: usize) -> Result<Self, MalformedResponse> {
        let mut fields = Fields::new(&buffer);
        let (mut revision, mut more, mut count) = (0, false, 0);
        let mut spans = Vec::with_capacity(expected.min(buffer.len() / 2));
        while let Some((tag, field)) = fields.next()? {
            match (tag, field) {
                (1, Field::Bytes(header)) => {
                    revision = header_revision(Fields::within(&buffer, header))?;
                }
                (2, Field::Bytes(kv)) => spans.push(key_value(Fields::within(&buffer, kv))?),
                (3, Field::Varint(value)) => more = value != 0,
                (4, Field::Varint(value)) => count = value as i64,
                (1..=4, _) => return Err(MalformedResponse("a field of the wrong wire type")),
                _ => {}
            }
        }
        Ok(Self {
            page: ListPage {
                buffer,
                spans,
                revision,
                remaining: count,
            },
            more,
        })
    }
}

/// `ResponseHeader.revision` (field 3).
fn header_revision(mut fields: Fields<'_>) -> Result<i64, MalformedResponse> {
    let mut revision = 0;
    while let Some((tag, field)) = fields.next()? {
        if let (3, Field::Varint(value)) = (tag, field) {
            revision = value as i64;
        }
    }
    Ok(revision)
}

/// One `mvccpb.KeyValue`.
fn key_value(mut fields: Fields<'_>) -> Result<Span, MalformedResponse> {
    if let Some(span) = key_value_as_etcd_writes(fields) {
        return Ok(span);
    }
    let mut span = Span::default();
    while let Some((tag, field)) = fields.next()? {
        match (tag, field) {
            (1, Field::Bytes(key)) => span.key = key,
            (2, Field::Varint(value)) => span.create_revision = value as i64,
            (3, Field::Varint(value)) => span.mod_revision = value as i64,
            (4, Field::Varint(value)) => span.version = value as i64,
            (5, Field::Bytes(value)) => span.value = value,
            (6, Field::Varint(value)) => span.lease = value as i64,
            (1..=6, _) => return Err(MalformedResponse("a field of the wrong wire type")),
            _ => {}
        }
    }
    Ok(span)
}

/// A `KeyValue` as etcd writes every one it has: key, create revision, mod revision,
/// version, value, and the lease unless it is 0, in field order and each once; `None` for
/// any other layout (a zero field left out, a field from a newer etcd, another order), which
/// the caller then reads field by field. A tag compared as one byte, not read and matched as
/// a field: 250k keys of an agent's sync behind kvstoremesh took 330 instructions a key
/// through the field loop (callgrind).
#[inline]
fn key_value_as_etcd_writes(mut fields: Fields<'_>) -> Option<Span> {
    let key = fields.tagged_bytes(1)?;
    let create_revision = fields.tagged_varint(2)? as i64;
    let mod_revision = fields.tagged_varint(3)? as i64;
    let version = fields.tagged_varint(4)? as i64;
    let value = fields.tagged_bytes(5)?;
    let lease = match fields.at < fields.buffer.len() {
        true => fields.tagged_varint(6)? as i64,
        false => 0,
    };
    (fields.at == fields.buffer.len()).then_some(Span {
        key,
        value,
        create_revision,
        mod_revision,
        version,
        lease,
    })
}

/// One field's payload: a varint, or where a length-delimited one lies in the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Field {
    Varint(u64),
    Bytes(Range<u32>),
    /// A fixed-width field (no field read here has one).
    Fixed,
}

/// The fields of one message: `buffer[at..]`, the buffer cut where the message ends so that
/// offsets stay those of the whole response.
#[derive(Clone, Copy)]
struct Fields<'a> {
    buffer: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    fn new(buffer: &'a [u8]) -> Self {
        Self { buffer, at: 0 }
    }

    fn within(buffer: &'a [u8], range: Range<u32>) -> Self {
        Self {
            buffer: &buffer[..range.end as usize],
            at: range.start as usize,
        }
    }

    /// A varint, as prost reads one: at most ten bytes, the tenth at most 1.
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        // Tags, versions and most lengths are one byte: that case takes one compare.
        let &first = self.buffer.get(self.at)?;
        self.at += 1;
        if first < 0x80 {
            return Some(u64::from(first));
        }
        let mut value = u64::from(first & 0x7f);
        for shift in (7..64).step_by(7) {
            let &byte = self.buffer.get(self.at)?;
            self.at += 1;
            if shift == 63 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    // By index, not through `bytes::Buf`: prost's own readers cost a third of a page's
    // decoding in calls and checks (callgrind of a sync). Inlined into each message's loop,
    // whose match on the tag then meets the wire type's directly.
    #[inline(always)]
    fn next(&mut self) -> Result<Option<(u32, Field)>, MalformedResponse> {
        if self.at >= self.buffer.len() {
            return Ok(None);
        }
        let key = self
            .varint()
            .filter(|&key| key <= u64::from(u32::MAX) && key >> 3 != 0)
            .ok_or(MalformedResponse("a bad field key"))?;
        let tag = (key >> 3) as u32;
        let field = match key & 7 {
            0 => Field::Varint(self.varint().ok_or(MalformedResponse("a bad varint"))?),
            2 => {
                let len = self.varint().ok_or(MalformedResponse("a bad length"))?;
                let start = self.at;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&len| len <= self.buffer.len() - start)
                    .ok_or(MalformedResponse("a length past the end"))?;
                self.at += len;
                Field::Bytes(offset(start)..offset(self.at))
            }
            1 => self.skip(8)?,
            5 => self.skip(4)?,
            3 | 4 => return Err(MalformedResponse("a group")),
            _ => return Err(MalformedResponse("a bad wire type")),
        };
        Ok(Some((tag, field)))
    }

    /// The varint of field `tag` when the next field is that one, a varint.
    #[inline]
    fn tagged_varint(&mut self, tag: u8) -> Option<u64> {
        (*self.buffer.get(self.at)? == tag << 3).then_some(())?;
        self.at += 1;
        self.varint()
    }

    /// Where the bytes of field `tag` lie when the next field is that one, length-delimited.
    #[inline]
    fn tagged_bytes(&mut self, tag: u8) -> Option<Range<u32>> {
        (*self.buffer.get(self.at)? == tag << 3 | 2).then_some(())?;
        self.at += 1;
        let len = usize::try_from(self.varint()?).ok()?;
        let start = self.at;
        (len <= self.buffer.len() - start).then_some(())?;
        self.at += len;
        Some(offset(start)..offset(self.at))
    }

    fn skip(&mut self, len: usize) -> Result<Field, MalformedResponse> {
        if self.buffer.len() - self.at < len {
            return Err(MalformedResponse("a fixed field past the end"));
        }
        self.at += len;
        Ok(Field::Fixed)
    }
}

/// The codec of `/etcdserverpb.KV/Range`: the request through prost, the response read in
/// place, for a page of at most `limit` keys.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RangeCodec {
    pub limit: usize,
}

impl Codec for RangeCodec {
    type Encode = RangeRequest;
    type Decode = RangeResponse;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        *self
    }

    fn decoder(&mut self) -> Self {
        *self
    }
}

impl Encoder for RangeCodec {
    type Item = RangeRequest;
    type Error = Status;

    fn encode(&mut self, item: RangeRequest, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::Message::encode(&item, dst).map_err(|err| Status::internal(err.to_string()))
    }
}

impl Decoder for RangeCodec {
    type Item = RangeResponse;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RangeResponse>, Status> {
        // The message lies in one piece of tonic's buffer: this takes it without a copy.
        let message = src.copy_to_bytes(src.remaining());
        RangeResponse::parse(message, self.limit)
            .map(Some)
            .map_err(|err| Status::internal(err.to_string()))
    }
}

/// The method's path on the etcd server.
pub(crate) const RANGE_PATH: &str = "/etcdserverpb.KV/Range";

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    // etcd's messages as prost generates them (rpc.proto, kv.proto), to write responses the
    // reader must read as prost reads them.
    #[derive(Clone, PartialEq, prost::Message)]
    struct PbHeader {
        #[prost(uint64, tag = "1")]
        cluster_id: u64,
        #[prost(uint64, tag = "2")]
        member_id: u64,
        #[prost(int64, tag = "3")]
        revision: i64,
        #[prost(uint64, tag = "4")]
        raft_term: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct PbKeyValue {
        #[prost(bytes = "vec", tag = "1")]
        key: Vec<u8>,
        #[prost(int64, tag = "2")]
        create_revision: i64,
        #[prost(int64, tag = "3")]
        mod_revision: i64,
        #[prost(int64, tag = "4")]
        version: i64,
        #[prost(bytes = "vec", tag = "5")]
        value: Vec<u8>,
        #[prost(int64, tag = "6")]
        lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct PbRangeResponse {
        #[prost(message, optional, tag = "1")]
        header: Option<PbHeader>,
        #[prost(message, repeated, tag = "2")]
        kvs: Vec<PbKeyValue>,
        #[prost(bool, tag = "3")]
        more: bool,
        #[prost(int64, tag = "4")]
        count: i64,
    }

    /// A response with a field this reader does not know (as a newer etcd might send).
    #[derive(Clone, PartialEq, prost::Message)]
    struct PbRangeResponseNewer {
        #[prost(message, optional, tag = "1")]
        header: Option<PbHeader>,
        #[prost(message, repeated, tag = "2")]
        kvs: Vec<PbKeyValue>,
        #[prost(bool, tag = "3")]
        more: bool,
        #[prost(int64, tag = "4")]
        count: i64,
        #[prost(string, tag = "9")]
        extra: String,
        #[prost(fixed64, tag = "10")]
        fixed: u64,
        #[prost(fixed32, tag = "11")]
        fixed32: u32,
    }

    fn kv(i: i64) -> PbKeyValue {
        PbKeyValue {
            key: format!("cilium/state/ip/v1/default/10.0.{}.{}", i / 256, i % 256).into_bytes(),
            create_revision: i,
            mod_revision: i * 1_000_003,
            version: i % 3,
            value: if i % 7 == 0 {
                Vec::new()
            } else {
                vec![b'x'; (i as usize * 37) % 300]
            },
            lease: if i % 2 == 0 { 0 } else { 0x7fff_0000_0000 + i },
        }
    }

    fn pairs(page: &ListPage) -> Vec<PbKeyValue> {
        page.kvs()
            .map(|kv| PbKeyValue {
                key: kv.key().to_vec(),
                create_revision: kv.create_revision(),
                mod_revision: kv.mod_revision(),
                version: kv.version(),
                value: kv.value().to_vec(),
                lease: kv.lease(),
            })
            .collect()
    }

    #[test]
    fn a_response_reads_as_prost_reads_it() {
        for n in [0, 1, 2, 1000] {
            let response = PbRangeResponse {
                header: Some(PbHeader {
                    cluster_id: u64::MAX,
                    member_id: 7,
                    revision: 1 << 40,
                    raft_term: 3,
                }),
                kvs: (0..n).map(kv).collect(),
                more: n == 2,
                count: n * 10,
            };
            let read = RangeResponse::parse(response.encode_to_vec().into(), 8).unwrap();
            assert_eq!(pairs(&read.page), response.kvs, "{n} keys");
            assert_eq!(read.page.len(), n as usize);
            assert_eq!(read.page.revision, 1 << 40);
            assert_eq!(read.page.remaining, n * 10);
            assert_eq!(read.more, n == 2);
            assert_eq!(
                read.page.last().map(|kv| kv.key().to_vec()),
                response.kvs.last().map(|kv| kv.key.clone())
            );
        }
    }

    #[test]
    fn unknown_fields_are_skipped_and_zeroes_may_be_absent() {
        let newer = PbRangeResponseNewer {
            header: None,
            kvs: vec![PbKeyValue::default(), kv(5)],
            more: false,
            count: 0,
            extra: "a field from the future".to_owned(),
            fixed: 1,
            fixed32: 2,
        };
        let read = RangeResponse::parse(newer.encode_to_vec().into(), 8).unwrap();
        assert_eq!(pairs(&read.page), newer.kvs);
        assert_eq!(
            (read.page.revision, read.page.remaining, read.more),
            (0, 0, false)
        );
    }

    #[test]
    fn a_key_value_in_any_layout_reads_as_prost_reads_it() {
        // As etcd writes it (read in one pass), fields out of order, a field repeated (the
        // last value wins), a zero left out, a field from a newer etcd: each read as prost
        // reads it.
        let layouts: [&[u8]; 7] = [
            &[
                0x0a, 1, b'k', 0x10, 3, 0x18, 5, 0x20, 1, 0x2a, 1, b'v', 0x30, 7,
            ],
            &[0x0a, 1, b'k', 0x10, 3, 0x18, 5, 0x20, 1, 0x2a, 1, b'v'],
            &[0x18, 5, 0x0a, 1, b'k', 0x2a, 1, b'v', 0x10, 3, 0x20, 1],
            &[
                0x0a, 1, b'k', 0x10, 3, 0x18, 5, 0x20, 1, 0x2a, 1, b'v', 0x18, 9,
            ],
            &[0x0a, 1, b'k', 0x10, 3, 0x18, 5, 0x2a, 1, b'v'],
            &[
                0x0a, 1, b'k', 0x10, 3, 0x18, 5, 0x20, 1, 0x2a, 1, b'v', 0x30, 7, 0x38, 1,
            ],
            &[
                0x0a, 1, b'k', 0x10, 3, 0x18, 5, 0x20, 1, 0x2a, 1, b'v', 0x30, 7, 0x18, 9,
            ],
        ];
        for layout in layouts {
            let mut response = vec![0x12, u8::try_from(layout.len()).unwrap()];
            response.extend_from_slice(layout);
            let reference = PbRangeResponse::decode(&response[..]).unwrap();
            let read = RangeResponse::parse(Bytes::from(response), 8).unwrap();
            assert_eq!(pairs(&read.page), reference.kvs, "{layout:?}");
        }
    }

    #[test]
    fn a_truncated_or_mistyped_response_is_refused() {
        let whole = PbRangeResponse {
            header: Some(PbHeader {
                revision: 9,
                ..PbHeader::default()
            }),
            kvs: (1..4).map(kv).collect(),
            more: true,
            count: 3,
        }
        .encode_to_vec();
        // Every cut inside a length-delimited field or a varint is an error, never a page
        // that silently lacks keys; a cut that falls between top-level fields is a shorter,
        // well-formed message, which prost too would accept.
        let mut refused = 0;
        for cut in 1..whole.len() {
            let reference = PbRangeResponse::decode(&whole[..cut]);
            let read = RangeResponse::parse(Bytes::copy_from_slice(&whole[..cut]), 8);
            assert_eq!(read.is_ok(), reference.is_ok(), "cut at {cut}");
            if let (Ok(read), Ok(reference)) = (read, reference) {
                assert_eq!(pairs(&read.page), reference.kvs, "cut at {cut}");
            } else {
                refused += 1;
            }
        }
        assert!(
            refused > whole.len() / 2,
            "{refused} of {} cuts refused",
            whole.len()
        );
        // `kvs` as a varint: prost refuses the wire type, and so does this reader.
        let mistyped: &'static [u8] = &[0x10, 0x01];
        assert!(PbRangeResponse::decode(mistyped).is_err());
        assert_eq!(
            RangeResponse::parse(Bytes::from_static(mistyped), 8).unwrap_err(),
            MalformedResponse("a field of the wrong wire type")
        );
    }

    #[test]
    fn varints_read_as_prost_reads_them() {
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for value in [0, 1, 127, 128, 300, 1 << 35, u64::from(u32::MAX), u64::MAX] {
            let mut bytes = Vec::new();
            prost::encoding::encode_varint(value, &mut bytes);
            cases.push(bytes);
        }
        // Ten bytes whose last is above 1, eleven bytes, an unfinished one, an empty one,
        // an overlong zero.
        cases.extend([
            vec![0xff; 9].into_iter().chain([0x02]).collect(),
            vec![0x80; 10].into_iter().chain([0x00]).collect(),
            vec![0x80, 0x80],
            vec![],
            vec![0x80, 0x00],
        ]);
        for bytes in cases {
            let reference = prost::encoding::decode_varint(&mut &bytes[..]).ok();
            let mut fields = Fields::new(&bytes);
            assert_eq!(fields.varint(), reference, "{bytes:x?}");
        }
        // A message's varint ends with the message, even where the buffer goes on.
        let bytes = [0x80, 0x01];
        assert_eq!(Fields::within(&bytes, 0..1).varint(), None);
        assert_eq!(Fields::within(&bytes, 0..2).varint(), Some(128));
    }

    #[test]
    fn the_request_encodes_as_etcds() {
        let request = RangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            limit: 3,
            revision: 4,
            serializable: true,
        };
        // etcd's RangeRequest: key 1, range_end 2, limit 3, revision 4, serializable 7.
        assert_eq!(
            request.encode_to_vec(),
            [0x0a, 1, b'k', 0x12, 1, b'l', 0x18, 3, 0x20, 4, 0x38, 1]
        );
    }
}
