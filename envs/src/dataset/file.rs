//! Reading a dataset file into JSON rows: JSON Lines (`.jsonl`, `.json` with one object per
//! line) or Parquet (`.parquet`, read row by row through the `parquet` crate's record API), so
//! both formats reach one row parser ([`super::row`]).
//!
//! Invariants:
//! - DF-F1 Rows come back in file order, each with its 1-based position (the JSONL line number,
//!   or the Parquet row number), so every error names the file and the row.
//! - DF-F2 A file that cannot be opened, decoded or holds no row is an error naming the file;
//!   nothing is skipped silently (blank JSONL lines are not rows and are passed over).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;
use serde_json::Value;

use crate::error::EnvError;

/// The formats a dataset file may have, chosen by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    JsonLines,
    /// Apache Parquet (verl's format).
    Parquet,
}

impl Format {
    /// The format of `path` by extension.
    pub fn of(path: &Path) -> Result<Format, EnvError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "json" | "ndjson") => Ok(Format::JsonLines),
            Some("parquet" | "pq") => Ok(Format::Parquet),
            _ => Err(file_error(
                path,
                "unknown format; expected a .jsonl (JSON Lines) or .parquet file",
            )),
        }
    }
}

/// One row as read, before it is parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct RawRow {
    /// 1-based line (JSONL) or row (Parquet) number (DF-F1).
    pub number: usize,
    /// The row as JSON.
    pub value: Value,
}

/// What a file holds, as read.
#[derive(Clone, Debug)]
pub struct RawFile {
    /// Its format.
    pub format: Format,
    /// Its rows, in order.
    pub rows: Vec<RawRow>,
}

/// The error of a whole file.
pub(crate) fn file_error(path: &Path, reason: impl Into<String>) -> EnvError {
    EnvError::Dataset {
        file: path.display().to_string(),
        row: 0,
        field: String::new(),
        reason: reason.into(),
    }
}

/// Reads every row of `path` (DF-F1, DF-F2).
pub fn read(path: &Path) -> Result<RawFile, EnvError> {
    let format = Format::of(path)?;
    let file = File::open(path).map_err(|e| file_error(path, format!("cannot open: {e}")))?;
    let rows = match format {
        Format::JsonLines => read_jsonl(path, file)?,
        Format::Parquet => read_parquet(path, file)?,
    };
    if rows.is_empty() {
        return Err(file_error(path, "holds no rows"));
    }
    Ok(RawFile { format, rows })
}

fn read_jsonl(path: &Path, file: File) -> Result<Vec<RawRow>, EnvError> {
    let mut rows = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let number = i + 1;
        let line = line.map_err(|e| file_error(path, format!("line {number}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line).map_err(|e| EnvError::Dataset {
            file: path.display().to_string(),
            row: number,
            field: String::new(),
            reason: format!("not a JSON object: {e}"),
        })?;
        rows.push(RawRow { number, value });
    }
    Ok(rows)
}

fn read_parquet(path: &Path, file: File) -> Result<Vec<RawRow>, EnvError> {
    let reader = SerializedFileReader::new(file)
        .map_err(|e| file_error(path, format!("not a Parquet file: {e}")))?;
    reader
        .get_row_iter(None)
        .map_err(|e| file_error(path, format!("cannot read rows: {e}")))?
        .enumerate()
        .map(|(i, row)| {
            let row = row.map_err(|e| file_error(path, format!("row {}: {e}", i + 1)))?;
            Ok(RawRow {
                number: i + 1,
                value: row.to_json_value(),
            })
        })
        .collect()
}

/// The shape of a JSON value as a type, e.g. `list<{content: string, role: string}>` (fields
/// in name order; the
/// schema `keel data check` prints: what keel reads, whatever the format).
pub fn shape(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(n) if n.is_f64() => "float".into(),
        Value::Number(_) => "int".into(),
        Value::String(_) => "string".into(),
        Value::Array(items) => match items.first() {
            Some(first) => format!("list<{}>", shape(first)),
            None => "list<>".into(),
        },
        Value::Object(fields) => {
            let inner: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("{k}: {}", shape(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}
