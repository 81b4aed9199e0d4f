//! TensorBoard's event-file format: TFRecord framing around `tensorflow.Event` protobufs.
//!
//! A record is `len: u64 LE | masked_crc32c(len bytes): u32 LE | data | masked_crc32c(data): u32
//! LE`, with `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8` (TensorFlow's
//! `record_writer.cc`). A file starts with an event holding `file_version = "brain.Event:2"`.
//! The messages below carry the field numbers of `tensorflow/core/util/event.proto`,
//! `summary.proto`, `tensor.proto` and `tensor_shape.proto`; fields that sit in a `oneof` there
//! are `optional` here, which is the same bytes on the wire and keeps a scalar of 0.0 present.
//!
//! Invariants:
//! - EF-1: [`record`] frames exactly as TensorFlow's record writer (checked against the
//!   `tensorboard` package's own reader in the integration test).
//! - EF-2: a scalar is `Summary.Value{tag, simple_value}`; a text is a rank-0 `DT_STRING` tensor
//!   with the `text` plugin's metadata, as `tf.summary.text` writes it.

use prost::Message;

/// `tensorflow.Event`.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// Global step.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// The first event of a file.
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// Values at this step.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    /// The series name.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// A scalar.
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
    /// A tensor (text summaries).
    #[prost(message, optional, tag = "8")]
    pub tensor: Option<TensorProto>,
    /// Which plugin reads the tensor.
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
}

/// `tensorflow.SummaryMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryMetadata {
    /// The plugin.
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `tensorflow.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    /// e.g. `text`.
    #[prost(string, tag = "1")]
    pub plugin_name: String,
    /// Plugin-specific content (empty for text).
    #[prost(bytes = "vec", tag = "2")]
    pub content: Vec<u8>,
}

/// `tensorflow.TensorProto` (the fields a string scalar needs).
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// `DT_STRING` = 7.
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    /// Rank 0: no dims.
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
    /// The strings.
    #[prost(bytes = "vec", repeated, tag = "8")]
    pub string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto` with no dims (a scalar).
#[derive(Clone, PartialEq, Message)]
pub struct TensorShape {}

const DT_STRING: i32 = 7;

/// TensorFlow's masked CRC32C.
fn masked_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
        .rotate_right(15)
        .wrapping_add(0xa282_ead8)
}

/// Appends one framed record holding `data` to `out` (EF-1).
pub fn record(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// The event that opens every file.
pub fn file_version(wall_time: f64) -> Event {
    Event {
        wall_time,
        step: 0,
        file_version: Some("brain.Event:2".into()),
        summary: None,
    }
}

/// An event with scalars `(tag, value)` at `step` (EF-2).
pub fn scalars(wall_time: f64, step: u64, values: &[(String, f64)]) -> Event {
    Event {
        wall_time,
        step: step as i64,
        file_version: None,
        summary: Some(Summary {
            value: values
                .iter()
                .map(|(tag, v)| SummaryValue {
                    tag: tag.clone(),
                    simple_value: Some(*v as f32),
                    tensor: None,
                    metadata: None,
                })
                .collect(),
        }),
    }
}

/// An event with the text `text` under `tag` at `step`, for TensorBoard's text tab (EF-2).
pub fn text(wall_time: f64, step: u64, tag: &str, text: &str) -> Event {
    Event {
        wall_time,
        step: step as i64,
        file_version: None,
        summary: Some(Summary {
            value: vec![SummaryValue {
                tag: tag.into(),
                simple_value: None,
                tensor: Some(TensorProto {
                    dtype: DT_STRING,
                    tensor_shape: Some(TensorShape {}),
                    string_val: vec![text.as_bytes().to_vec()],
                }),
                metadata: Some(SummaryMetadata {
                    plugin_data: Some(PluginData {
                        plugin_name: "text".into(),
                        content: Vec::new(),
                    }),
                }),
            }],
        }),
    }
}

/// Appends `event` as a record to `out`.
pub fn append(event: &Event, out: &mut Vec<u8>) {
    record(&event.encode_to_vec(), out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::manual_rotate)] // TensorFlow's formula, written as it is there
    fn ef1_record_framing_matches_tensorflow() {
        // CRC32C("123456789") = 0xe3069283 (RFC 3720's check value).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let mut out = Vec::new();
        record(b"abc", &mut out);
        assert_eq!(out.len(), 8 + 4 + 3 + 4);
        assert_eq!(&out[..8], &3u64.to_le_bytes());
        assert_eq!(&out[12..15], b"abc");
        let c = crc32c::crc32c(b"abc");
        let masked = ((c >> 15) | (c << 17)).wrapping_add(0xa282_ead8);
        assert_eq!(&out[15..], &masked.to_le_bytes());
    }

    #[test]
    fn ef2_a_zero_scalar_is_still_on_the_wire() {
        let e = scalars(1.0, 3, &[("a".into(), 0.0)]);
        let back = Event::decode(e.encode_to_vec().as_slice()).expect("decode");
        assert_eq!(
            back.summary.expect("summary").value[0].simple_value,
            Some(0.0)
        );
    }
}
