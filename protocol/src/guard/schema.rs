//! The schema DSL the generated tables in `schemas.rs` are written in, and the
//! walker that checks a body against them.
//!
//! A field is present in versions `min..=max`. Strings, bytes and arrays use
//! their compact (unsigned varint) encodings from the message's first flexible
//! version on, and every struct then ends with a tagged-field section; that is
//! how Kafka's generator works, so the tables need not repeat it per field.

/// "Present up to the newest version": Kafka's `"3+"`.
pub(crate) const MAX: i16 = i16::MAX;
/// `flexible_from` for messages that have no flexible version.
pub(crate) const NEVER: i16 = i16::MAX;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    Int8,
    Int16,
    Int32,
    Int64,
    Uuid,
    Float64,
    Bool,
    /// Nullable or not: the walker accepts null everywhere and leaves it to
    /// the decoder to refuse null where the field does not allow it.
    String,
    Bytes,
    /// A record batch blob; walked like bytes, parsed later by the broker.
    Records,
    /// Elements, and the bytes one element takes in memory once decoded
    /// (the decoder allocates count x that for the array's `Vec`).
    Array(&'static Ty, usize),
    Struct(&'static [Field]),
}

pub(crate) const INT8: Ty = Ty::Int8;
pub(crate) const INT16: Ty = Ty::Int16;
pub(crate) const INT32: Ty = Ty::Int32;
pub(crate) const INT64: Ty = Ty::Int64;
pub(crate) const UUID: Ty = Ty::Uuid;
#[allow(dead_code)] // no supported request has one yet; responses and future APIs do
pub(crate) const FLOAT64: Ty = Ty::Float64;
pub(crate) const BOOL: Ty = Ty::Bool;
pub(crate) const STRING: Ty = Ty::String;
pub(crate) const BYTES: Ty = Ty::Bytes;
pub(crate) const RECORDS: Ty = Ty::Records;

/// An array of a primitive type; its element's size in memory follows from
/// the type.
pub(crate) const fn array(element: &'static Ty) -> Ty {
    let element_bytes = match element {
        Ty::Int8 | Ty::Bool => 1,
        Ty::Int16 => 2,
        Ty::Int32 => 4,
        Ty::Int64 | Ty::Float64 => 8,
        Ty::Uuid => 16,
        // Decoded as `StrBytes` / `Bytes` views of the frame: no copy.
        Ty::String => size_of::<kafka_protocol::protocol::StrBytes>(),
        Ty::Bytes | Ty::Records => size_of::<bytes::Bytes>(),
        Ty::Array(..) => size_of::<Vec<u8>>(),
        Ty::Struct(_) => panic!("an array of structs names its element's size: use array_of"),
    };
    Ty::Array(element, element_bytes)
}

/// An array of structs whose decoded element takes `element_bytes`
/// (`size_of` the generated Rust struct).
pub(crate) const fn array_of(element: &'static Ty, element_bytes: usize) -> Ty {
    Ty::Array(element, element_bytes)
}

/// What the decoder allocates for unknown tagged fields, which it keeps in a
/// `BTreeMap<i32, Bytes>` per struct (values are views of the frame): the
/// map's first leaf (about 400 bytes, for 11 entries), and per field its
/// share of nodes at least half full, internal ones included.
const UNKNOWN_TAGGED_FIELDS_MAP_BYTES: u64 = 512;
const UNKNOWN_TAGGED_FIELD_BYTES: u64 = 128;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    pub(crate) name: &'static str,
    pub(crate) min_version: i16,
    pub(crate) max_version: i16,
    pub(crate) ty: Ty,
    /// `Some(tag)` for a tagged field, which lives in the tagged-field section.
    pub(crate) tag: Option<u32>,
}

pub(crate) const fn field(name: &'static str, min_version: i16, max_version: i16, ty: Ty) -> Field {
    Field {
        name,
        min_version,
        max_version,
        ty,
        tag: None,
    }
}

pub(crate) const fn tagged(
    tag: u32,
    name: &'static str,
    min_version: i16,
    max_version: i16,
    ty: Ty,
) -> Field {
    Field {
        name,
        min_version,
        max_version,
        ty,
        tag: Some(tag),
    }
}

impl Field {
    fn present_in(&self, version: i16) -> bool {
        self.min_version <= version && version <= self.max_version
    }
}

/// One request message: the versions kafka-protocol decodes, where flexible
/// versions start, and the top-level struct.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Message {
    pub(crate) versions: (i16, i16),
    pub(crate) flexible_from: i16,
    pub(crate) body: &'static [Field],
}

/// Why a body was refused before decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("{field}: needs at least {needed} bytes but {remaining} remain")]
    Truncated {
        field: &'static str,
        needed: u64,
        remaining: usize,
    },
    #[error("{field}: negative length {length}")]
    NegativeLength { field: &'static str, length: i64 },
    #[error("{field}: unsigned varint longer than 5 bytes or above u32::MAX")]
    BadVarint { field: &'static str },
    #[error("tagged field {tag}: declares {declared} bytes but its content takes {used}")]
    TaggedFieldSize { tag: u32, declared: u64, used: u64 },
    #[error("no guard schema for api key {api_key} version {api_version}")]
    NoSchema { api_key: i16, api_version: i16 },
}

/// A cursor over a borrowed body. Reads never allocate.
struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    /// Bytes the decoder will allocate for what has been walked so far.
    decoded_bytes: u64,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    fn take(&mut self, field: &'static str, n: u64) -> Result<&'a [u8], GuardError> {
        if n > self.remaining() as u64 {
            return Err(GuardError::Truncated {
                field,
                needed: n,
                remaining: self.remaining(),
            });
        }
        let start = self.position;
        self.position += n as usize;
        Ok(&self.bytes[start..self.position])
    }

    fn int16(&mut self, field: &'static str) -> Result<i16, GuardError> {
        let b = self.take(field, 2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn int32(&mut self, field: &'static str) -> Result<i32, GuardError> {
        let b = self.take(field, 4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Kafka's unsigned varint. kafka-protocol silently truncates a sixth
    /// continuation byte or bits above 32; refusing those keeps the value we
    /// check identical to the value the decoder uses.
    fn unsigned_varint(&mut self, field: &'static str) -> Result<u32, GuardError> {
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = self.take(field, 1)?[0] as u32;
            if i == 4 && b > 0x0F {
                return Err(GuardError::BadVarint { field });
            }
            value |= (b & 0x7F) << (i * 7);
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(GuardError::BadVarint { field })
    }
}

/// The fewest bytes a value of `ty` can take in `version`. Arrays are checked
/// against this before any element is walked, so a declared count can never
/// exceed what the remaining bytes could hold.
fn min_len(ty: &Ty, version: i16, flexible: bool) -> u64 {
    match ty {
        Ty::Int8 | Ty::Bool => 1,
        Ty::Int16 => 2,
        Ty::Int32 => 4,
        Ty::Int64 | Ty::Float64 => 8,
        Ty::Uuid => 16,
        // Null is the shortest value: one varint byte, or the fixed-width -1.
        Ty::String if flexible => 1,
        Ty::String => 2,
        Ty::Bytes | Ty::Records | Ty::Array(..) if flexible => 1,
        Ty::Bytes | Ty::Records | Ty::Array(..) => 4,
        Ty::Struct(fields) => {
            let own: u64 = fields
                .iter()
                .filter(|f| f.tag.is_none() && f.present_in(version))
                .map(|f| min_len(&f.ty, version, flexible))
                .sum();
            own + u64::from(flexible)
        }
    }
}

/// Walks one value, checking every declared length and count against the
/// bytes that remain.
fn walk(
    r: &mut Reader<'_>,
    name: &'static str,
    ty: &Ty,
    version: i16,
    flexible: bool,
) -> Result<(), GuardError> {
    match ty {
        Ty::Int8 | Ty::Bool | Ty::Int16 | Ty::Int32 | Ty::Int64 | Ty::Float64 | Ty::Uuid => {
            r.take(name, min_len(ty, version, flexible))?;
        }
        Ty::String => {
            if flexible {
                let n = r.unsigned_varint(name)?;
                if n > 0 {
                    r.take(name, u64::from(n) - 1)?;
                }
            } else {
                let n = r.int16(name)?;
                check_fixed_length(name, i64::from(n))?;
                if n > 0 {
                    r.take(name, n as u64)?;
                }
            }
        }
        Ty::Bytes | Ty::Records => {
            if flexible {
                let n = r.unsigned_varint(name)?;
                if n > 0 {
                    r.take(name, u64::from(n) - 1)?;
                }
            } else {
                let n = r.int32(name)?;
                check_fixed_length(name, i64::from(n))?;
                if n > 0 {
                    r.take(name, n as u64)?;
                }
            }
        }
        Ty::Array(element, element_bytes) => {
            let count = if flexible {
                u64::from(r.unsigned_varint(name)?).saturating_sub(1)
            } else {
                let n = r.int32(name)?;
                check_fixed_length(name, i64::from(n))?;
                n.max(0) as u64
            };
            // At least one byte per element even if a schema ever had an
            // empty struct, so the walk stays linear in the body length.
            let needed = count.saturating_mul(min_len(element, version, flexible).max(1));
            if needed > r.remaining() as u64 {
                return Err(GuardError::Truncated {
                    field: name,
                    needed,
                    remaining: r.remaining(),
                });
            }
            // Cannot overflow: count is below the body length.
            r.decoded_bytes += count * *element_bytes as u64;
            for _ in 0..count {
                walk(r, name, element, version, flexible)?;
            }
        }
        Ty::Struct(fields) => walk_struct(r, fields, version, flexible)?,
    }
    Ok(())
}

/// Fixed-width lengths: -1 is null, other negatives are malformed.
fn check_fixed_length(name: &'static str, n: i64) -> Result<(), GuardError> {
    if n < -1 {
        return Err(GuardError::NegativeLength {
            field: name,
            length: n,
        });
    }
    Ok(())
}

fn walk_struct(
    r: &mut Reader<'_>,
    fields: &'static [Field],
    version: i16,
    flexible: bool,
) -> Result<(), GuardError> {
    for f in fields
        .iter()
        .filter(|f| f.tag.is_none() && f.present_in(version))
    {
        walk(r, f.name, &f.ty, version, flexible)?;
    }
    if flexible {
        walk_tagged_fields(r, fields, version)?;
    }
    Ok(())
}

/// The tagged-field section: a count, then (tag, size, value) triples. A
/// known tag is walked with its type, and must fill exactly its declared
/// size, because kafka-protocol decodes known tags straight from the buffer
/// without honouring the size. Unknown tags are skipped by size.
fn walk_tagged_fields(
    r: &mut Reader<'_>,
    fields: &'static [Field],
    version: i16,
) -> Result<(), GuardError> {
    let count = r.unsigned_varint("tagged fields")?;
    // Each tagged field takes at least a tag byte and a size byte.
    if u64::from(count) * 2 > r.remaining() as u64 {
        return Err(GuardError::Truncated {
            field: "tagged fields",
            needed: u64::from(count) * 2,
            remaining: r.remaining(),
        });
    }
    let mut unknown = 0u64;
    for _ in 0..count {
        let tag = r.unsigned_varint("tag")?;
        let size = u64::from(r.unsigned_varint("tagged field size")?);
        let content = r.take("tagged field", size)?;
        // Matched by tag alone: where kafka-protocol knows a tag but not for
        // this version it refuses the request, so walking it is harmless.
        if let Some(known) = fields.iter().find(|f| f.tag == Some(tag)) {
            let mut inner = Reader {
                bytes: content,
                position: 0,
                decoded_bytes: 0,
            };
            walk(&mut inner, known.name, &known.ty, version, true)?;
            if inner.position as u64 != size {
                return Err(GuardError::TaggedFieldSize {
                    tag,
                    declared: size,
                    used: inner.position as u64,
                });
            }
            r.decoded_bytes += inner.decoded_bytes;
        } else {
            unknown += 1;
        }
    }
    if unknown > 0 {
        r.decoded_bytes += UNKNOWN_TAGGED_FIELDS_MAP_BYTES + unknown * UNKNOWN_TAGGED_FIELD_BYTES;
    }
    Ok(())
}

/// What a walk found: the bytes a body takes, and what decoding it will
/// allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyWalk {
    /// Bytes of the body the message takes; any after that are ignored.
    pub len: usize,
    /// Bytes the decoder allocates for it: every array's elements and every
    /// unknown tagged field. Strings, bytes and record batches decode as
    /// views of the frame and cost nothing here.
    pub decoded_bytes: u64,
}

/// Walks a whole body.
pub(crate) fn walk_message(
    message: &Message,
    version: i16,
    body: &[u8],
) -> Result<BodyWalk, GuardError> {
    let mut r = Reader {
        bytes: body,
        position: 0,
        decoded_bytes: 0,
    };
    walk_struct(
        &mut r,
        message.body,
        version,
        version >= message.flexible_from,
    )?;
    Ok(BodyWalk {
        len: r.position,
        decoded_bytes: r.decoded_bytes,
    })
}

/// Walks a request header of `header_version` (1 or 2): api key, api
/// version, correlation id, a nullable client id that stays a classic
/// (non-compact) string even in v2, then v2's tagged fields. Returns its length.
pub(crate) fn walk_request_header(
    header_version: i16,
    frame: &[u8],
) -> Result<BodyWalk, GuardError> {
    let mut r = Reader {
        bytes: frame,
        position: 0,
        decoded_bytes: 0,
    };
    r.take("request header", 8)?;
    walk(&mut r, "client_id", &Ty::String, 0, false)?;
    if header_version >= 2 {
        walk_tagged_fields(&mut r, &[], header_version)?;
    }
    Ok(BodyWalk {
        len: r.position,
        decoded_bytes: r.decoded_bytes,
    })
}
