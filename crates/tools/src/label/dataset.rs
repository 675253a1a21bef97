//! The unlabeled dataset: CSV or JSON lines, one example per line (a CSV
//! record of numbers; a JSON array of numbers or an object holding one),
//! read row by row so a file larger than memory can be labelled. CSV
//! fields may be quoted but not span lines (an example is numbers).
//!
//! # Invariants
//! - Rows are numbered from 0 in file order, counting data rows only (a
//!   skipped CSV header and blank lines are not rows); errors name both the
//!   row and the 1-based line.
//! - Every row has the length of row 0 and only finite numbers; the first
//!   violation ends the iteration with its error.
//! - The fingerprint depends only on the values of the rows, in order, so
//!   the same examples give the same fingerprint whatever the file format.

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// Input file format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Comma-separated numbers, one example per record.
    Csv,
    /// JSON lines: each line an array of numbers, or an object whose
    /// `--field` is one.
    Jsonl,
}

impl Format {
    /// The format a file name implies: `.csv`, `.jsonl` or `.ndjson`.
    ///
    /// # Errors
    /// [`DatasetError::Parquet`] for `.parquet`, [`DatasetError::UnknownFormat`]
    /// for anything else.
    pub fn from_path(path: &Path) -> Result<Format, DatasetError> {
        let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("csv") => Ok(Format::Csv),
            Some("jsonl" | "ndjson") => Ok(Format::Jsonl),
            Some("parquet") => Err(DatasetError::Parquet),
            _ => Err(DatasetError::UnknownFormat),
        }
    }
}

/// Whether a CSV file starts with a header record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Header {
    /// The first record is a header if none of its fields is a number.
    #[default]
    Auto,
    /// The first record is a header: skip it.
    Yes,
    /// Every record is data.
    No,
}

/// How to read a file.
#[derive(Clone, Debug)]
pub struct Options {
    /// CSV or JSON lines.
    pub format: Format,
    /// CSV header handling (ignored for JSON lines).
    pub header: Header,
    /// For JSON lines objects: the field holding the example.
    pub field: String,
}

/// One example.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// 0-based position among the file's data rows.
    pub index: u64,
    /// 1-based line where it starts.
    pub line: u64,
    /// Its values, all finite.
    pub values: Vec<f64>,
}

/// Why a file cannot be labelled.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// No format from the extension.
    #[error("cannot tell the format from the file name; pass --format csv or --format jsonl")]
    UnknownFormat,
    /// Parquet input is not implemented.
    #[error("Parquet input is not supported; convert it to CSV or JSON lines")]
    Parquet,
    /// Opening or reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A line could not be read (e.g. it is not UTF-8).
    #[error("line {line}: {source}")]
    Line {
        /// 1-based line.
        line: u64,
        /// The reader's error.
        source: std::io::Error,
    },
    /// The CSV reader could not split a line.
    #[error("line {line}: {message}")]
    Csv {
        /// 1-based line.
        line: u64,
        /// The CSV reader's description.
        message: String,
    },
    /// A row that cannot be sent.
    #[error("line {line} (row {row}): {problem}")]
    Row {
        /// 1-based line.
        line: u64,
        /// 0-based row index.
        row: u64,
        /// What is wrong with it.
        problem: Problem,
    },
    /// Nothing to label.
    #[error("no rows")]
    Empty,
    /// A second reading found another number of rows than the first.
    #[error("the file changed while it was being labelled (it had {rows} rows when checked)")]
    Changed {
        /// Rows found by the first reading.
        rows: u64,
    },
}

/// What is wrong with one row.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Problem {
    /// A value that does not parse as a number.
    #[error("value {position} ({value}) is not a number")]
    NotANumber {
        /// 1-based position in the row.
        position: usize,
        /// The offending text (shortened).
        value: String,
    },
    /// The first CSV record has a number and a non-number: neither clearly
    /// data nor clearly a header.
    #[error(
        "value {position} ({value}) is not a number (the first record is taken as a header only when none of its \
         fields is a number; pass --header yes to skip it)"
    )]
    AmbiguousHeader {
        /// 1-based position in the row.
        position: usize,
        /// The offending text (shortened).
        value: String,
    },
    /// NaN or infinite.
    #[error("value {position} ({value}) is not finite")]
    NotFinite {
        /// 1-based position in the row.
        position: usize,
        /// The offending text (shortened).
        value: String,
    },
    /// A row whose length differs from row 0's.
    #[error("{got} values, but row 0 has {expected}")]
    Length {
        /// Values in this row.
        got: usize,
        /// Values in row 0.
        expected: usize,
    },
    /// A row with no values.
    #[error("no values")]
    NoValues,
    /// A JSON lines line that is not JSON.
    #[error("not JSON: {0}")]
    Json(String),
    /// A JSON object without the example field.
    #[error("the object has no field {0:?} (choose the field with --field)")]
    MissingField(String),
    /// A JSON value that is neither an array nor an object holding one.
    #[error("expected an array of numbers (or an object whose field {field:?} is one), found {found}")]
    NotAnArray {
        /// The `--field` in use.
        field: String,
        /// What was found instead ("a string", "null", ...).
        found: &'static str,
    },
}

/// The rows of a file, in order. Stops after the first error.
pub struct Rows<R: Read> {
    source: Source<R>,
    next_index: u64,
    expected: Option<usize>,
    failed: bool,
}

/// Lines of the file and how to read one.
struct Source<R: Read> {
    lines: std::io::Lines<BufReader<R>>,
    /// 1-based number of the last line read.
    line: u64,
    format: Format,
    header: Header,
    field: String,
    /// No CSV record read yet (the header candidate is next).
    first: bool,
}

impl<R: Read> Rows<R> {
    /// Rows of `reader` read as `options` say.
    pub fn new(reader: R, options: &Options) -> Self {
        let source = Source {
            lines: BufReader::new(reader).lines(),
            line: 0,
            format: options.format,
            header: options.header,
            field: options.field.clone(),
            first: true,
        };
        Rows { source, next_index: 0, expected: None, failed: false }
    }

    /// The next row's line and values, before the length check.
    fn next_values(&mut self) -> Option<Result<(u64, Vec<f64>), DatasetError>> {
        let row = self.next_index;
        let s = &mut self.source;
        loop {
            let text = match s.lines.next()? {
                Ok(t) => t,
                Err(e) => return Some(Err(DatasetError::Line { line: s.line + 1, source: e })),
            };
            s.line += 1;
            // A UTF-8 byte-order mark (spreadsheet exports) is not data.
            let text = if s.line == 1 { text.strip_prefix('\u{feff}').unwrap_or(&text) } else { &text };
            if text.trim().is_empty() {
                continue;
            }
            let line = s.line;
            let values = match s.format {
                Format::Jsonl => json_values(text, &s.field),
                Format::Csv => {
                    let fields = match csv_fields(text) {
                        Ok(f) => f,
                        Err(e) => return Some(Err(DatasetError::Csv { line, message: e.to_string() })),
                    };
                    let first = std::mem::replace(&mut s.first, false);
                    let skip = first
                        && match s.header {
                            Header::Yes => true,
                            Header::No => false,
                            Header::Auto => fields.iter().all(|f| f.parse::<f64>().is_err()),
                        };
                    if skip {
                        continue;
                    }
                    csv_values(&fields, first && s.header == Header::Auto)
                }
            };
            return Some(values.map(|v| (line, v)).map_err(|problem| DatasetError::Row { line, row, problem }));
        }
    }
}

/// The fields of one CSV line (quotes honoured, whitespace trimmed).
fn csv_fields(line: &str) -> Result<csv::StringRecord, csv::Error> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .buffer_capacity(line.len().max(1))
        .from_reader(line.as_bytes());
    let mut record = csv::StringRecord::new();
    reader.read_record(&mut record)?;
    Ok(record)
}

impl<R: Read> Iterator for Rows<R> {
    type Item = Result<Row, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let index = self.next_index;
        let checked = self.next_values()?.and_then(|(line, values)| {
            let bad = |problem| DatasetError::Row { line, row: index, problem };
            match self.expected {
                _ if values.is_empty() => Err(bad(Problem::NoValues)),
                Some(expected) if values.len() != expected => Err(bad(Problem::Length { got: values.len(), expected })),
                _ => Ok(Row { index, line, values }),
            }
        });
        match &checked {
            Ok(row) => {
                self.expected = Some(row.values.len());
                self.next_index += 1;
            }
            Err(_) => self.failed = true,
        }
        Some(checked)
    }
}

/// At most 40 characters of `text`, for error messages.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn csv_values(record: &csv::StringRecord, first: bool) -> Result<Vec<f64>, Problem> {
    record
        .iter()
        .enumerate()
        .map(|(i, field)| {
            let value = format!("{:?}", shorten(field));
            match field.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(v),
                Ok(_) => Err(Problem::NotFinite { position: i + 1, value }),
                Err(_) if first => Err(Problem::AmbiguousHeader { position: i + 1, value }),
                Err(_) => Err(Problem::NotANumber { position: i + 1, value }),
            }
        })
        .collect()
}

fn json_values(text: &str, field: &str) -> Result<Vec<f64>, Problem> {
    use serde_json::Value;
    let value: Value = serde_json::from_str(text).map_err(|e| Problem::Json(e.to_string()))?;
    let array = match &value {
        Value::Array(a) => a,
        Value::Object(o) => match o.get(field) {
            Some(Value::Array(a)) => a,
            Some(other) => return Err(Problem::NotAnArray { field: field.to_owned(), found: kind(other) }),
            None => return Err(Problem::MissingField(field.to_owned())),
        },
        other => return Err(Problem::NotAnArray { field: field.to_owned(), found: kind(other) }),
    };
    array
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_f64() {
            Some(x) if x.is_finite() => Ok(x),
            Some(_) => Err(Problem::NotFinite { position: i + 1, value: shorten(&v.to_string()) }),
            None => Err(Problem::NotANumber { position: i + 1, value: shorten(&v.to_string()) }),
        })
        .collect()
}

fn kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// SHA-256 over the rows' values in order (each row: its length as u64,
/// then its values as f64, little-endian).
#[derive(Clone, Default)]
pub struct Fingerprint(Sha256);

impl Fingerprint {
    /// Adds the next row.
    pub fn add(&mut self, values: &[f64]) {
        self.0.update((values.len() as u64).to_le_bytes());
        for v in values {
            self.0.update(v.to_le_bytes());
        }
    }

    /// Lowercase hex digest.
    pub fn finish(self) -> String {
        pacpriv_service::session::hex(&self.0.finalize())
    }
}

/// What a whole, valid file holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Number of rows.
    pub rows: u64,
    /// Values per row.
    pub features: usize,
    /// [`Fingerprint`] of all rows.
    pub sha256: String,
}

/// Reads every row, checking it, without keeping them.
///
/// # Errors
/// The first bad row, a read error, or a file without rows.
pub fn scan<R: Read>(rows: Rows<R>) -> Result<Summary, DatasetError> {
    let mut fingerprint = Fingerprint::default();
    let (mut n, mut features) = (0, 0);
    for row in rows {
        let row = row?;
        fingerprint.add(&row.values);
        n += 1;
        features = row.values.len();
    }
    if n == 0 {
        return Err(DatasetError::Empty);
    }
    Ok(Summary { rows: n, features, sha256: fingerprint.finish() })
}
