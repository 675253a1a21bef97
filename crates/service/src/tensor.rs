//! Wire tensors ↔ `f64` values: decoding the Open Inference Protocol's
//! typed contents or raw little-endian bytes, for client inputs (server)
//! and teacher outputs (teachers) alike.
//!
//! # Invariants
//! - A tensor's values come from exactly one place: `contents` of its
//!   datatype, or its raw bytes; anything else is an error, never a guess.
//! - Decoded values are finite; NaN/Inf are rejected with their position.

use crate::proto::inference::InferTensorContents;

/// Why a tensor could not be decoded. Messages are written for the person
/// who built the request.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TensorError {
    /// A datatype this service does not read.
    #[error("datatype {got:?} is not supported here; use one of {supported}")]
    Datatype {
        /// What was sent.
        got: String,
        /// What is accepted, e.g. "FP32, FP64".
        supported: &'static str,
    },
    /// Values sent in the contents field of another datatype, or both in
    /// contents and raw bytes, or nowhere.
    #[error("{0}")]
    Contents(String),
    /// Raw bytes whose length is not a multiple of the element size.
    #[error("raw contents of {len} bytes are not a whole number of {datatype} elements ({size} bytes each)")]
    RawLength {
        /// Bytes received.
        len: usize,
        /// Declared datatype.
        datatype: String,
        /// Element size in bytes.
        size: usize,
    },
    /// The number of values does not match the shape.
    #[error("shape {shape:?} holds {expected} values but {got} were sent")]
    Count {
        /// Declared shape.
        shape: Vec<i64>,
        /// Product of the shape.
        expected: usize,
        /// Values received.
        got: usize,
    },
    /// A NaN or infinite value.
    #[error("value at flat index {index} is {value}; inputs must be finite numbers")]
    NonFinite {
        /// Row-major position.
        index: usize,
        /// The value.
        value: f64,
    },
}

/// Datatypes accepted for features: the floating-point ones.
pub const FLOAT_TYPES: &str = "FP32, FP64";

/// Decodes a floating-point tensor (FP32 or FP64) from typed contents or
/// raw bytes and checks the value count against `shape`.
///
/// # Errors
/// [`TensorError`] naming what to fix.
pub fn decode_floats(
    datatype: &str,
    shape: &[i64],
    contents: Option<&InferTensorContents>,
    raw: Option<&[u8]>,
) -> Result<Vec<f64>, TensorError> {
    let values = match datatype {
        "FP32" | "FP64" => decode(datatype, contents, raw)?,
        other => return Err(TensorError::Datatype { got: other.to_owned(), supported: FLOAT_TYPES }),
    };
    check_count(shape, values.len())?;
    check_finite(&values)?;
    Ok(values)
}

/// Decodes any numeric tensor (floats, signed or unsigned integers; a
/// teacher's label or scores) to `f64`, checking finiteness.
///
/// # Errors
/// [`TensorError`].
pub fn decode_numbers(
    datatype: &str,
    contents: Option<&InferTensorContents>,
    raw: Option<&[u8]>,
) -> Result<Vec<f64>, TensorError> {
    let values = decode(datatype, contents, raw)?;
    check_finite(&values)?;
    Ok(values)
}

const NUMERIC_TYPES: &str = "FP32, FP64, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64";

fn decode(datatype: &str, contents: Option<&InferTensorContents>, raw: Option<&[u8]>) -> Result<Vec<f64>, TensorError> {
    let size = match datatype {
        "INT8" | "UINT8" => 1,
        "INT16" | "UINT16" => 2,
        "FP32" | "INT32" | "UINT32" => 4,
        "FP64" | "INT64" | "UINT64" => 8,
        other => return Err(TensorError::Datatype { got: other.to_owned(), supported: NUMERIC_TYPES }),
    };
    let typed = contents.filter(|c| filled_field(c).is_some());
    match (typed, raw.filter(|r| !r.is_empty())) {
        (Some(_), Some(_)) => Err(TensorError::Contents(
            "values were sent both in typed contents and as raw bytes; send them in one place".into(),
        )),
        (Some(c), None) => from_contents(datatype, c),
        (None, Some(bytes)) => from_raw(datatype, size, bytes),
        // An empty tensor: legal only if the shape says so (checked later).
        (None, None) => Ok(Vec::new()),
    }
}

fn from_contents(datatype: &str, c: &InferTensorContents) -> Result<Vec<f64>, TensorError> {
    // The spec puts each datatype in one field (INT8..INT32 share
    // int_contents, UINT8..UINT32 share uint_contents); values in any other
    // field mean the datatype and the values disagree.
    let (field, values): (&str, Vec<f64>) = match datatype {
        "FP32" => ("fp32_contents", c.fp32_contents.iter().map(|&v| f64::from(v)).collect()),
        "FP64" => ("fp64_contents", c.fp64_contents.clone()),
        "INT8" | "INT16" | "INT32" => ("int_contents", c.int_contents.iter().map(|&v| f64::from(v)).collect()),
        "INT64" => ("int64_contents", c.int64_contents.iter().map(|&v| v as f64).collect()),
        "UINT8" | "UINT16" | "UINT32" => ("uint_contents", c.uint_contents.iter().map(|&v| f64::from(v)).collect()),
        _ => ("uint64_contents", c.uint64_contents.iter().map(|&v| v as f64).collect()),
    };
    if values.is_empty() {
        let sent = filled_field(c).unwrap_or("an unrelated field");
        return Err(TensorError::Contents(format!(
            "datatype {datatype} expects its values in {field}, but they were sent in {sent}"
        )));
    }
    Ok(values)
}

fn filled_field(c: &InferTensorContents) -> Option<&'static str> {
    [
        ("bool_contents", c.bool_contents.is_empty()),
        ("int_contents", c.int_contents.is_empty()),
        ("int64_contents", c.int64_contents.is_empty()),
        ("uint_contents", c.uint_contents.is_empty()),
        ("uint64_contents", c.uint64_contents.is_empty()),
        ("fp32_contents", c.fp32_contents.is_empty()),
        ("fp64_contents", c.fp64_contents.is_empty()),
        ("bytes_contents", c.bytes_contents.is_empty()),
    ]
    .into_iter()
    .find_map(|(name, empty)| (!empty).then_some(name))
}

fn from_raw(datatype: &str, size: usize, bytes: &[u8]) -> Result<Vec<f64>, TensorError> {
    if !bytes.len().is_multiple_of(size) {
        return Err(TensorError::RawLength { len: bytes.len(), datatype: datatype.to_owned(), size });
    }
    let convert: fn(&[u8]) -> f64 = match datatype {
        "FP32" => |b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        "FP64" => |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        "INT8" => |b| f64::from(b[0] as i8),
        "UINT8" => |b| f64::from(b[0]),
        "INT16" => |b| f64::from(i16::from_le_bytes([b[0], b[1]])),
        "UINT16" => |b| f64::from(u16::from_le_bytes([b[0], b[1]])),
        "INT32" => |b| f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        "UINT32" => |b| f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        "INT64" => |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
        _ => |b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
    };
    Ok(bytes.chunks_exact(size).map(convert).collect())
}

fn check_count(shape: &[i64], got: usize) -> Result<(), TensorError> {
    let expected = shape.iter().try_fold(1usize, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)));
    match expected {
        Some(expected) if expected == got => Ok(()),
        // A negative dimension cannot be satisfied; report it as 0 expected.
        expected => Err(TensorError::Count { shape: shape.to_vec(), expected: expected.unwrap_or(0), got }),
    }
}

fn check_finite(values: &[f64]) -> Result<(), TensorError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(TensorError::NonFinite { index, value: values[index] }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn raw_and_typed_fp32_decode_to_the_same_values() -> Result<(), TensorError> {
        let v = [1.5f32, -2.0, 16.0];
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let typed = InferTensorContents { fp32_contents: v.to_vec(), ..Default::default() };
        let a = decode_floats("FP32", &[1, 3], None, Some(&raw))?;
        let b = decode_floats("FP32", &[3], Some(&typed), None)?;
        assert_eq!(a, vec![1.5, -2.0, 16.0]);
        assert_eq!(a, b);
        Ok(())
    }

    #[test]
    fn integer_labels_decode_from_both_forms() -> Result<(), TensorError> {
        let raw: Vec<u8> = 7i64.to_le_bytes().to_vec();
        assert_eq!(decode_numbers("INT64", None, Some(&raw))?, vec![7.0]);
        let typed = InferTensorContents { int_contents: vec![3], ..Default::default() };
        assert_eq!(decode_numbers("INT32", Some(&typed), None)?, vec![3.0]);
        Ok(())
    }

    #[test]
    fn bad_tensors_are_rejected_with_what_to_fix() {
        let nan = InferTensorContents { fp64_contents: vec![0.0, f64::NAN], ..Default::default() };
        assert!(matches!(decode_floats("FP64", &[2], Some(&nan), None), Err(TensorError::NonFinite { index: 1, .. })));
        let ok = InferTensorContents { fp64_contents: vec![0.0; 3], ..Default::default() };
        assert!(matches!(
            decode_floats("FP64", &[4], Some(&ok), None),
            Err(TensorError::Count { expected: 4, got: 3, .. })
        ));
        assert!(matches!(decode_floats("INT64", &[3], Some(&ok), None), Err(TensorError::Datatype { .. })));
        // FP32 declared, values in fp64_contents.
        let msg = decode_floats("FP32", &[3], Some(&ok), None).map_err(|e| e.to_string());
        assert_eq!(
            msg,
            Err("datatype FP32 expects its values in fp32_contents, but they were sent in fp64_contents".into())
        );
        assert!(matches!(decode_floats("FP64", &[3], Some(&ok), Some(&[0; 24])), Err(TensorError::Contents(_))));
        assert!(matches!(decode_floats("FP32", &[1], None, Some(&[0; 5])), Err(TensorError::RawLength { .. })));
        assert!(matches!(decode_floats("FP32", &[-1], None, Some(&[0; 4])), Err(TensorError::Count { .. })));
        let msg = decode_floats("FP16", &[1], None, None).map_err(|e| e.to_string());
        assert_eq!(msg, Err("datatype \"FP16\" is not supported here; use one of FP32, FP64".into()));
    }
}
