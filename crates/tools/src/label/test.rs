use super::dataset::{DatasetError, Format, Header, Options, Problem, Rows, Summary, scan};
use super::journal::{self, Answer, Journal, JournalError};
use super::{parse_alpha, tensor_shape};
use std::path::Path;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn csv(header: Header) -> Options {
    Options { format: Format::Csv, header, field: "input".into() }
}

fn jsonl(field: &str) -> Options {
    Options { format: Format::Jsonl, header: Header::Auto, field: field.into() }
}

fn values(text: &str, options: &Options) -> Result<Vec<Vec<f64>>, DatasetError> {
    Rows::new(text.as_bytes(), options).map(|r| r.map(|r| r.values)).collect()
}

fn problem(text: &str, options: &Options) -> (u64, u64, Problem) {
    match values(text, options) {
        Err(DatasetError::Row { line, row, problem }) => (line, row, problem),
        other => panic!("expected a bad row, got {other:?}"),
    }
}

#[test]
fn format_comes_from_the_extension() {
    assert_eq!(Format::from_path(Path::new("a/b.csv")).ok(), Some(Format::Csv));
    assert_eq!(Format::from_path(Path::new("b.CSV")).ok(), Some(Format::Csv));
    assert_eq!(Format::from_path(Path::new("b.jsonl")).ok(), Some(Format::Jsonl));
    assert_eq!(Format::from_path(Path::new("b.ndjson")).ok(), Some(Format::Jsonl));
    assert!(matches!(Format::from_path(Path::new("b.parquet")), Err(DatasetError::Parquet)));
    assert!(matches!(Format::from_path(Path::new("b.json")), Err(DatasetError::UnknownFormat)));
    assert!(matches!(Format::from_path(Path::new("b")), Err(DatasetError::UnknownFormat)));
}

#[test]
fn csv_header_is_skipped_only_when_it_has_no_number() -> TestResult {
    let with = "a,b,c\n1,2,3\n4, 5 ,6e0\n";
    assert_eq!(values(with, &csv(Header::Auto))?, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    assert_eq!(values(with, &csv(Header::Yes))?, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    let without = "1,2,3\n4,5,6\n";
    assert_eq!(values(without, &csv(Header::Auto))?, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    assert_eq!(values(without, &csv(Header::Yes))?, [[4.0, 5.0, 6.0]]);
    // Forced data: the header's first field is reported.
    let (line, row, p) = problem(with, &csv(Header::No));
    assert_eq!((line, row), (1, 0));
    assert_eq!(p, Problem::NotANumber { position: 1, value: "\"a\"".into() });
    // Half numbers: not taken for a header, and the message says how to skip it.
    let (_, row, p) = problem("id,1,2\n1,2,3\n", &csv(Header::Auto));
    assert_eq!(row, 0);
    assert!(matches!(p, Problem::AmbiguousHeader { position: 1, .. }), "{p:?}");
    assert!(p.to_string().contains("--header yes"), "{p}");
    Ok(())
}

#[test]
fn csv_quotes_and_byte_order_marks_are_understood() -> TestResult {
    assert_eq!(values("\u{feff}1,2\n\"3.5\",\" 4\"\n", &csv(Header::Auto))?, [[1.0, 2.0], [3.5, 4.0]]);
    assert_eq!(values("\u{feff}[1,2]\n", &jsonl("input"))?, [[1.0, 2.0]]);
    let (_, row, p) = problem("1,2\n\"1,5\",2\n", &csv(Header::Auto));
    assert_eq!((row, p), (1, Problem::NotANumber { position: 1, value: "\"1,5\"".into() }));
    Ok(())
}

#[test]
fn csv_rows_and_lines_are_counted_separately() -> TestResult {
    let text = "x,y\n1,2\n\n3,4\n5,oops\n";
    let (line, row, p) = problem(text, &csv(Header::Auto));
    assert_eq!((line, row), (5, 2), "blank lines and the header are lines, not rows");
    assert_eq!(p, Problem::NotANumber { position: 2, value: "\"oops\"".into() });
    let rows: Vec<(u64, u64)> = Rows::new("1,2\n\n3,4\n".as_bytes(), &csv(Header::Auto))
        .map(|r| r.map(|r| (r.index, r.line)))
        .collect::<Result<_, _>>()?;
    assert_eq!(rows, [(0, 1), (1, 3)]);
    let rows: Vec<(u64, u64)> = Rows::new("1,2\r\n3,4".as_bytes(), &csv(Header::Auto))
        .map(|r| r.map(|r| (r.index, r.line)))
        .collect::<Result<_, _>>()?;
    assert_eq!(rows, [(0, 1), (1, 2)], "CRLF, and a last line without its newline");
    Ok(())
}

#[test]
fn wrong_lengths_and_non_finite_values_are_refused() {
    let (line, row, p) = problem("1,2,3\n4,5\n", &csv(Header::Auto));
    assert_eq!((line, row, p), (2, 1, Problem::Length { got: 2, expected: 3 }));
    let (_, row, p) = problem("1,2\n3,4,5\n", &csv(Header::Auto));
    assert_eq!((row, p), (1, Problem::Length { got: 3, expected: 2 }));
    let (_, _, p) = problem("1,2\n3,NaN\n", &csv(Header::Auto));
    assert!(matches!(p, Problem::NotFinite { position: 2, .. }), "{p:?}");
    let (_, _, p) = problem("1,2\n3,inf\n", &csv(Header::Auto));
    assert!(matches!(p, Problem::NotFinite { position: 2, .. }), "{p:?}");
    let (_, _, p) = problem("1,2\n3,\n", &csv(Header::Auto));
    assert_eq!(p, Problem::NotANumber { position: 2, value: "\"\"".into() });
    let (_, _, p) = problem("[]\n", &jsonl("input"));
    assert_eq!(p, Problem::NoValues);
}

#[test]
fn iteration_stops_at_the_first_error() {
    let all: Vec<_> = Rows::new("1,2\n3\n4,5\n".as_bytes(), &csv(Header::Auto)).collect();
    assert_eq!(all.len(), 2);
    assert!(all[0].is_ok() && all[1].is_err());
}

#[test]
fn json_lines_take_arrays_or_a_field_of_objects() -> TestResult {
    let text = "[1, 2.5]\n\n{\"input\": [3, 4], \"id\": \"x\"}\n";
    assert_eq!(values(text, &jsonl("input"))?, [[1.0, 2.5], [3.0, 4.0]]);
    assert_eq!(values("{\"pixels\": [1, 2]}\n", &jsonl("pixels"))?, [[1.0, 2.0]]);

    let (line, row, p) = problem("[1,2]\n\n{\"pixels\": [1, 2]}\n", &jsonl("input"));
    assert_eq!((line, row, p), (3, 1, Problem::MissingField("input".into())));
    let (_, _, p) = problem("[1,2]\n[1,\"a\"]\n", &jsonl("input"));
    assert_eq!(p, Problem::NotANumber { position: 2, value: "\"a\"".into() });
    let (_, _, p) = problem("[[1,2],[3,4]]\n", &jsonl("input"));
    assert_eq!(p, Problem::NotANumber { position: 1, value: "[1,2]".into() });
    let (_, _, p) = problem("\"1,2\"\n", &jsonl("input"));
    assert_eq!(p, Problem::NotAnArray { field: "input".into(), found: "a string" });
    let (_, _, p) = problem("{\"input\": 3}\n", &jsonl("input"));
    assert_eq!(p, Problem::NotAnArray { field: "input".into(), found: "a number" });
    let (_, _, p) = problem("[1,2\n", &jsonl("input"));
    assert!(matches!(p, Problem::Json(_)), "{p:?}");
    Ok(())
}

#[test]
fn the_fingerprint_depends_on_the_values_only() -> TestResult {
    let from_csv = scan(Rows::new("a,b\n1,2\n3,4\n".as_bytes(), &csv(Header::Auto)))?;
    let from_json = scan(Rows::new("[1,2]\n{\"input\":[3.0,4]}\n".as_bytes(), &jsonl("input")))?;
    assert_eq!(from_csv, from_json);
    assert_eq!((from_csv.rows, from_csv.features, from_csv.sha256.len()), (2, 2, 64));
    let other = scan(Rows::new("1,2\n3,5\n".as_bytes(), &csv(Header::Auto)))?;
    assert_ne!(other.sha256, from_csv.sha256);
    // Rows are delimited: [1,2],[3,4] is not [1,2,3,4] split differently.
    let split = scan(Rows::new("1\n2\n3\n4\n".as_bytes(), &csv(Header::Auto)))?;
    let whole = scan(Rows::new("1,2,3,4\n".as_bytes(), &csv(Header::Auto)))?;
    assert_ne!(split.sha256, whole.sha256);
    assert!(matches!(scan(Rows::new("a,b\n".as_bytes(), &csv(Header::Auto))), Err(DatasetError::Empty)));
    Ok(())
}

fn header(summary: &Summary, alpha: f64) -> journal::Header {
    journal::Header::new(Path::new("in.csv"), summary.rows, summary.features, summary.sha256.clone(), alpha)
}

fn summary(rows: u64) -> Summary {
    Summary { rows, features: 64, sha256: "ab".repeat(32) }
}

fn answer(row: u64, confident: bool) -> Answer {
    Answer { row, label: (row % 10) as u32, confident, unanimous: confident, mi_charged: 1.0 / 256.0, contested: false }
}

#[test]
fn a_journal_continues_where_it_stopped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = journal::path_for(&dir.path().join("labels.csv"));
    assert_eq!(path, dir.path().join("labels.csv.answers"));
    let h = header(&summary(5), 0.01);
    let mut opened = Journal::open(&path, &h)?;
    assert!(opened.answers.is_empty());
    for row in 0..3 {
        opened.journal.append(&answer(row, row != 1))?;
    }
    drop(opened);
    let again = Journal::open(&path, &h)?;
    assert_eq!(again.answers, [answer(0, true), answer(1, false), answer(2, true)]);
    assert!(!again.dropped_torn_line);
    let text = std::fs::read_to_string(&path)?;
    assert_eq!(text.lines().count(), 4, "a header and one line per answer:\n{text}");
    Ok(())
}

#[test]
fn a_torn_last_line_is_dropped_and_the_file_cut_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("j.answers");
    let h = header(&summary(5), 0.01);
    let mut opened = Journal::open(&path, &h)?;
    opened.journal.append(&answer(0, true))?;
    drop(opened);
    let good = std::fs::read(&path)?;
    std::fs::write(&path, [good.as_slice(), b"{\"row\":1,\"lab"].concat())?;
    let mut again = Journal::open(&path, &h)?;
    assert!(again.dropped_torn_line);
    assert_eq!(again.answers, [answer(0, true)]);
    assert_eq!(std::fs::read(&path)?, good, "the torn bytes are gone");
    again.journal.append(&answer(1, false))?;
    drop(again);
    assert_eq!(Journal::open(&path, &h)?.answers, [answer(0, true), answer(1, false)]);

    // A torn header: nothing was answered, start over.
    std::fs::write(&path, b"{\"format\":\"pacpriv-la")?;
    let fresh = Journal::open(&path, &h)?;
    assert!(fresh.answers.is_empty());
    drop(fresh);
    assert!(std::fs::read_to_string(&path)?.ends_with("\"alpha\":0.01}\n"));
    Ok(())
}

#[test]
fn corrupt_or_foreign_journals_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("j.answers");
    let h = header(&summary(3), 0.01);
    let mut opened = Journal::open(&path, &h)?;
    for row in 0..3 {
        opened.journal.append(&answer(row, true))?;
    }
    drop(opened);
    let good = std::fs::read_to_string(&path)?;

    let other = journal::Header::new(Path::new("b.csv"), 3, 64, "cd".repeat(32), 0.01);
    let e = Journal::open(&path, &other).err().ok_or("other input accepted")?;
    assert!(matches!(e, JournalError::OtherInput { .. }), "{e:?}");
    assert!(e.to_string().contains("in.csv: 3 rows of 64 values"), "{e}");
    let e = Journal::open(&path, &header(&summary(4), 0.01)).err().ok_or("other row count accepted")?;
    assert!(matches!(e, JournalError::OtherInput { .. }), "{e:?}");
    let e = Journal::open(&path, &header(&summary(3), 0.05)).err().ok_or("other alpha accepted")?;
    assert!(matches!(e, JournalError::OtherAlpha { journal } if journal == 0.01), "{e:?}");

    let lines: Vec<&str> = good.lines().collect();
    std::fs::write(&path, format!("{}\n{}\n{}\n", lines[0], lines[1], lines[3]))?;
    let e = Journal::open(&path, &h).err().ok_or("gap accepted")?;
    assert!(matches!(e, JournalError::OutOfOrder { line: 3, got: 2, expected: 1 }), "{e:?}");
    std::fs::write(&path, format!("{}\nnot json\n{}\n", lines[0], lines[2]))?;
    let e = Journal::open(&path, &h).err().ok_or("garbage accepted")?;
    assert!(matches!(e, JournalError::Corrupt { line: 2, .. }), "{e:?}");
    std::fs::write(&path, format!("{good}{}\n", serde_json::to_string(&answer(3, true))?))?;
    let e = Journal::open(&path, &h).err().ok_or("surplus accepted")?;
    assert!(matches!(e, JournalError::TooMany { answers: 4, rows: 3 }), "{e:?}");
    std::fs::write(&path, good.replace("pacpriv-label-journal/1", "pacpriv-label-journal/9"))?;
    assert!(matches!(Journal::open(&path, &h), Err(JournalError::Format(_))));
    Ok(())
}

#[test]
fn the_kept_file_holds_confident_answers_only() -> TestResult {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("labels.csv");
    std::fs::write(&out, "stale")?;
    let answers = [answer(0, true), answer(1, false), answer(2, true)];
    assert_eq!(journal::write_kept(&out, &answers)?, 2);
    assert_eq!(std::fs::read_to_string(&out)?, "row,label\n0,0\n2,2\n");
    assert_eq!(journal::write_kept(&out, &[])?, 0);
    assert_eq!(std::fs::read_to_string(&out)?, "row,label\n");
    assert!(!dir.path().join("labels.csv.tmp").exists());
    Ok(())
}

#[test]
fn shapes_and_levels_are_checked() {
    assert_eq!(tensor_shape(None, 64).ok(), Some(vec![64]));
    assert_eq!(tensor_shape(Some(&[8, 8]), 64).ok(), Some(vec![8, 8]));
    assert!(tensor_shape(Some(&[8, 9]), 64).is_err_and(|e| e.to_string().contains("holds 72 values")));
    assert!(tensor_shape(Some(&[u64::MAX, 2]), 64).is_err());
    assert_eq!(parse_alpha("0.01"), Ok(0.01));
    for bad in ["0", "1", "-0.1", "x", "NaN"] {
        assert!(parse_alpha(bad).is_err(), "{bad}");
    }
}
