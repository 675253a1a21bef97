//! The answer journal `<out>.answers`: JSON lines, a header naming the
//! input, then one line per answered row in row order, each written and
//! flushed as its answer arrives. It is what makes a labelling job
//! resumable without paying twice: rows it holds are never sent again.
//!
//! # Invariants
//! - Line 1 is a [`Header`]; line k + 2 answers row k. A rerun continues
//!   at the first row without an answer.
//! - A journal is only ever continued for the same rows (same count,
//!   length and [`super::dataset::Fingerprint`]) and the same α.
//! - A last line without its newline is an answer torn by a crash: it is
//!   dropped (that answer was paid for and is lost; see docs/tools/label.md). Any
//!   other unreadable line is an error, never silently skipped.

use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Value of [`Header::format`].
pub const FORMAT: &str = "pacpriv-label-journal/1";

/// What the journal was written for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`FORMAT`].
    pub format: String,
    /// The input file as given on the first run (informational).
    pub input: String,
    /// Rows in the input.
    pub rows: u64,
    /// Values per row.
    pub features: usize,
    /// Fingerprint of the rows' values.
    pub sha256: String,
    /// Confidence level the `confident` flags were computed at.
    pub alpha: f64,
    /// Written by `--unanimous-only` (contested rows refused, not asked
    /// through the stream).
    #[serde(default, skip_serializing_if = "is_false")]
    pub unanimous_only: bool,
    /// The model asked (`--model`; empty: the server's default model).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One answered row.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// 0-based row of the input.
    pub row: u64,
    /// The released label.
    pub label: u32,
    /// Passed the confidence test (kept).
    pub confident: bool,
    /// All teachers agreed (the label is exact).
    pub unanimous: bool,
    /// MI charged for it, in nats.
    pub mi_charged: f64,
    /// Refused as contested (`--unanimous-only`): no label, nothing
    /// charged, never kept.
    #[serde(default, skip_serializing_if = "is_false")]
    pub contested: bool,
}

/// Why a journal cannot be continued.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A line that is neither a header nor an answer.
    #[error("line {line} is not a journal entry ({message})")]
    Corrupt {
        /// 1-based line.
        line: usize,
        /// The parser's complaint.
        message: String,
    },
    /// Answers out of row order.
    #[error("line {line} answers row {got} where row {expected} was expected")]
    OutOfOrder {
        /// 1-based line.
        line: usize,
        /// Row found.
        got: u64,
        /// Row expected.
        expected: u64,
    },
    /// Written by another version of this tool.
    #[error("its format is {0:?}, not {FORMAT:?}")]
    Format(String),
    /// The rows differ from the ones the journal answers.
    #[error(
        "it belongs to another input ({journal}); this input is {now}. Label this input into another --out, or \
         rerun with the original input"
    )]
    OtherInput {
        /// The journal's input.
        journal: String,
        /// This run's input.
        now: String,
    },
    /// The confidence level differs.
    #[error("it was written with --alpha {journal}; rerun with that, or label into another --out")]
    OtherAlpha {
        /// The journal's α.
        journal: f64,
    },
    /// Written with(out) `--unanimous-only`, continued the other way.
    #[error(
        "it was written {}; rerun that way, or label into another --out",
        if *unanimous_only { "with --unanimous-only" } else { "without --unanimous-only" }
    )]
    OtherMode {
        /// How the journal was written.
        unanimous_only: bool,
    },
    /// Another model was asked.
    #[error(
        "it was written asking model {journal:?} (--model; empty: the server's default); rerun with that, or \
         label into another --out"
    )]
    OtherModel {
        /// The journal's model.
        journal: String,
    },
    /// More answers than rows.
    #[error("it holds {answers} answers but the input has only {rows} rows")]
    TooMany {
        /// Answers found.
        answers: usize,
        /// Rows of the input.
        rows: u64,
    },
}

/// How often appended answers are synced to disk, at most: the bound on
/// what a machine crash (not just a killed process) can lose.
pub const SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// An open journal, positioned after its last complete answer.
pub struct Journal {
    file: BufWriter<File>,
    synced: std::time::Instant,
}

/// A journal just opened, and what it already held.
pub struct Opened {
    /// Ready for appending.
    pub journal: Journal,
    /// Its answers, rows 0, 1, … in order.
    pub answers: Vec<Answer>,
    /// A torn last line was dropped.
    pub dropped_torn_line: bool,
}

impl Header {
    /// A header describing `rows` rows of `features` values with the given
    /// fingerprint, labelled at `alpha`.
    pub fn new(input: &Path, rows: u64, features: usize, sha256: String, alpha: f64) -> Header {
        Header {
            format: FORMAT.to_owned(),
            input: input.display().to_string(),
            rows,
            features,
            sha256,
            alpha,
            unanimous_only: false,
            model: String::new(),
        }
    }

    /// The same, asking the model `model`.
    pub fn model(self, model: &str) -> Header {
        Header { model: model.to_owned(), ..self }
    }

    /// The same, for a `--unanimous-only` job when `on`.
    pub fn unanimous_only(self, on: bool) -> Header {
        Header { unanimous_only: on, ..self }
    }

    fn describe(&self) -> String {
        let short = self.sha256.get(..12).unwrap_or(&self.sha256);
        format!("{}: {} rows of {} values, fingerprint {short}…", self.input, self.rows, self.features)
    }

    /// Whether a journal written under `self` may be continued by a run
    /// described by `now`.
    fn check(&self, now: &Header) -> Result<(), JournalError> {
        if self.format != FORMAT {
            return Err(JournalError::Format(self.format.clone()));
        }
        if (self.rows, self.features, &self.sha256) != (now.rows, now.features, &now.sha256) {
            return Err(JournalError::OtherInput { journal: self.describe(), now: now.describe() });
        }
        if self.alpha != now.alpha {
            return Err(JournalError::OtherAlpha { journal: self.alpha });
        }
        if self.unanimous_only != now.unanimous_only {
            return Err(JournalError::OtherMode { unanimous_only: self.unanimous_only });
        }
        if self.model != now.model {
            return Err(JournalError::OtherModel { journal: self.model.clone() });
        }
        Ok(())
    }
}

/// `<out>.answers`.
pub fn path_for(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".answers");
    PathBuf::from(name)
}

impl Journal {
    /// Opens the journal at `path` for a run described by `header`:
    /// creates it if missing (or holding no complete line), otherwise
    /// checks its header and reads its answers.
    ///
    /// # Errors
    /// I/O, a corrupt journal, or one written for other rows or another α.
    pub fn open(path: &Path, header: &Header) -> Result<Opened, JournalError> {
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let Some(header_end) = text.iter().position(|&b| b == b'\n') else {
            // Nothing (or a torn header): nothing was answered yet.
            let mut file = File::create(path)?;
            file.write_all(format!("{}\n", to_line(header)?).as_bytes())?;
            file.sync_all()?;
            let file = OpenOptions::new().append(true).open(path)?;
            return Ok(Opened { journal: Journal::new(file), answers: Vec::new(), dropped_torn_line: false });
        };
        let corrupt = |line: usize, e: serde_json::Error| JournalError::Corrupt { line, message: e.to_string() };
        let written: Header = serde_json::from_slice(&text[..header_end]).map_err(|e| corrupt(1, e))?;
        written.check(header)?;

        let mut answers = Vec::new();
        let mut complete = header_end + 1;
        let mut dropped_torn_line = false;
        for (k, line) in text[complete..].split_inclusive(|&b| b == b'\n').enumerate() {
            let number = k + 2;
            let Some(body) = line.strip_suffix(b"\n") else {
                dropped_torn_line = true;
                break;
            };
            let answer: Answer = serde_json::from_slice(body).map_err(|e| corrupt(number, e))?;
            let expected = answers.len() as u64;
            if answer.row != expected {
                return Err(JournalError::OutOfOrder { line: number, got: answer.row, expected });
            }
            answers.push(answer);
            complete += line.len();
        }
        if answers.len() as u64 > header.rows {
            return Err(JournalError::TooMany { answers: answers.len(), rows: header.rows });
        }
        let file = OpenOptions::new().append(true).open(path)?;
        if dropped_torn_line {
            file.set_len(complete as u64)?;
            file.sync_all()?;
        }
        Ok(Opened { journal: Journal::new(file), answers, dropped_torn_line })
    }

    fn new(file: File) -> Journal {
        Journal { file: BufWriter::new(file), synced: std::time::Instant::now() }
    }

    /// Appends one answer and hands it to the operating system, so it
    /// survives this process being killed; syncs to disk when the last
    /// sync is [`SYNC_INTERVAL`] old, so a machine crash loses at most
    /// about that much.
    ///
    /// # Errors
    /// I/O.
    pub fn append(&mut self, answer: &Answer) -> Result<(), JournalError> {
        writeln!(self.file, "{}", to_line(answer)?)?;
        self.file.flush()?;
        if self.synced.elapsed() >= SYNC_INTERVAL {
            self.sync()?;
        }
        Ok(())
    }

    /// Flushes to disk.
    ///
    /// # Errors
    /// I/O.
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.file.flush()?;
        self.file.get_ref().sync_data()?;
        self.synced = std::time::Instant::now();
        Ok(())
    }
}

fn to_line<T: Serialize>(value: &T) -> Result<String, JournalError> {
    serde_json::to_string(value).map_err(|e| JournalError::Io(io::Error::other(e)))
}

/// Rewrites `out` as CSV `row,label` with the confident answers, through a
/// temporary file renamed into place. Returns how many rows it holds.
///
/// # Errors
/// I/O.
pub fn write_kept(out: &Path, answers: &[Answer]) -> io::Result<usize> {
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut w = BufWriter::new(File::create(&tmp)?);
    writeln!(w, "row,label")?;
    let mut kept = 0;
    for a in answers.iter().filter(|a| a.confident) {
        writeln!(w, "{},{}", a.row, a.label)?;
        kept += 1;
    }
    w.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()?;
    std::fs::rename(&tmp, out)?;
    Ok(kept)
}
