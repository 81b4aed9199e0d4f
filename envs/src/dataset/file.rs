//! Reading a dataset file into JSON rows: JSON Lines (`.jsonl`, `.ndjson`, `.json` with one
//! object per line), a JSON array of row objects (`.json`, as Hugging Face `datasets` reads
//! it) or Parquet (`.parquet`, read row by row through the `parquet` crate's record API), so
//! every format reaches one row parser ([`super::row`]).
//!
//! Invariants:
//! - FL-1 Rows come back in file order, each with its 1-based position (the JSONL line number,
//!   the JSON array element, or the Parquet row number), so every error names the file and the
//!   row.
//! - FL-2 A file that cannot be opened, decoded or holds no row is an error naming the file;
//!   nothing is skipped silently (blank JSONL lines are not rows and are passed over).
//! - FL-3 A UTF-8 byte order mark at the start of a JSON file is skipped (Windows editors and
//!   pandas' `utf-8-sig` write one); a `.json` file whose first character after it is `[` is
//!   read as a JSON array of rows, any other as JSON Lines, and an error reading a `.json` file
//!   says which two layouts keel reads.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
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
    /// A `.json` file holding one JSON array of row objects (FL-3).
    JsonArray,
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
                "unknown format; expected a .jsonl (JSON Lines), .json (JSON Lines or a JSON array of rows) or .parquet file",
            )),
        }
    }
}

/// One row as read, before it is parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct RawRow {
    /// 1-based line (JSONL) or row (Parquet) number (FL-1).
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

/// Reads every row of `path` (FL-1, FL-2).
pub fn read(path: &Path) -> Result<RawFile, EnvError> {
    let format = Format::of(path)?;
    let file = File::open(path).map_err(|e| file_error(path, format!("cannot open: {e}")))?;
    let (format, rows) = match format {
        Format::Parquet => (format, read_parquet(path, file)?),
        _ => read_json(path, file)?,
    };
    if rows.is_empty() {
        return Err(file_error(path, "holds no rows"));
    }
    Ok(RawFile { format, rows })
}

/// The UTF-8 byte order mark (FL-3).
const BOM: char = '\u{feff}';

/// What keel reads from a `.json` file, said in its errors (FL-3).
const JSON_LAYOUTS: &str =
    "keel reads a .json file as a JSON array of row objects or as JSON Lines (one JSON object per line)";

/// A JSON Lines file or, for `.json`, a JSON array of rows (FL-3).
fn read_json(path: &Path, file: File) -> Result<(Format, Vec<RawRow>), EnvError> {
    let is_json = path.extension().and_then(|e| e.to_str()) == Some("json");
    let mut reader = BufReader::new(file);
    if is_json {
        let mut text = String::new();
        reader
            .read_to_string(&mut text)
            .map_err(|e| file_error(path, format!("cannot read: {e}")))?;
        let body = text.strip_prefix(BOM).unwrap_or(&text);
        if body.trim_start().starts_with('[') {
            return Ok((Format::JsonArray, read_array(path, body)?));
        }
        let rows = read_lines(path, body.lines().map(|l| Ok(l.to_string())), true)?;
        return Ok((Format::JsonLines, rows));
    }
    let rows = read_lines(path, reader.lines(), false)?;
    Ok((Format::JsonLines, rows))
}

fn read_array(path: &Path, body: &str) -> Result<Vec<RawRow>, EnvError> {
    let items: Vec<Value> = serde_json::from_str(body).map_err(|e| {
        file_error(
            path,
            format!("starts with `[` but is not one JSON array ({e}); {JSON_LAYOUTS}"),
        )
    })?;
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(i, value)| RawRow {
            number: i + 1,
            value,
        })
        .collect())
}

fn read_lines(
    path: &Path,
    lines: impl Iterator<Item = std::io::Result<String>>,
    is_json: bool,
) -> Result<Vec<RawRow>, EnvError> {
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let number = i + 1;
        let line = line.map_err(|e| file_error(path, format!("line {number}: {e}")))?;
        let line = match i {
            0 => line.strip_prefix(BOM).unwrap_or(&line),
            _ => line.as_str(),
        };
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| {
            let hint = if is_json {
                format!("; {JSON_LAYOUTS}")
            } else {
                String::new()
            };
            EnvError::Dataset {
                file: path.display().to_string(),
                row: number,
                field: String::new(),
                reason: format!("not a JSON object on one line (JSON Lines): {e}{hint}"),
            }
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
