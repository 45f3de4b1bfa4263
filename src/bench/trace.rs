//! Replays of the two real traces shipped in `data/` (see its README).
//!
//! **Finding them.** `--trace-dir`, else `$WARMPATH_DATA_DIR` ([`data_dir`]), else `data/` in
//! the source tree this binary was built from, else `data/` beside the running binary; a
//! directory may hold a trace as `NAME.jsonl` or gzip-compressed as `NAME.jsonl.gz`
//! ([`trace_file`]). The repository ships the compressed files; [`read_mooncake`] and
//! [`read_ragpulse`] decompress them (flate2, pure Rust) when a replay is built, never while it
//! runs.
//!
//! **Mooncake** (`mooncake_synthetic_trace.jsonl`) has no session ids; [`mooncake_parents`]
//! derives them exactly as the data README says: row B follows an earlier row A when all of A's
//! full blocks (every hash id but A's last) are a prefix of B's ids, with at least 2 full blocks,
//! and B's input is longer than A's; among candidates the longest match wins, then the most
//! recent. Full-block lists of earlier rows are kept in a hash map keyed by the list itself, and
//! each row looks up its own prefixes from longest to shortest (O(ids²) hashing per row, a few
//! milliseconds for the whole trace). A session is a connected component of these links: a
//! tree, since two rows may extend the same parent; each follow-up waits for its parent. Each
//! hash id expands to 512 words derived from the id, the last to the remainder of the input
//! length, so equal ids give equal text ([`super::workload`]).
//!
//! **RAGPulse** (`ragpulse_0_trace.jsonl`) names its sessions. Its quirks: timestamps are
//! strings (seconds), the file ends with a blank line (blank lines are skipped), and one pair of
//! rows is out of order (rows are sorted stably by timestamp before replay). A session's turns
//! follow each other in timestamp order. Prompt components are rendered in the listed order
//! (system prompt, passages, history, web search, user input); every chunk gets an equal share
//! of `input_length` (the last chunk also the remainder). Shares differ between rows, so a chunk
//! id shared by two rows gives texts of which the shorter is a prefix of the longer (words are a
//! stream per id): they share up to the shorter share, then diverge.
//!
//! Both are time-compressed: a row at trace time `t` is sent no earlier than `t / time_scale`
//! after the start of the run.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use flate2::read::MultiGzDecoder;
use serde::Deserialize;

use super::workload::{Prompt, Session, Turn, Workload, BLOCK_WORDS};

/// The Mooncake trace's file name (uncompressed).
pub const MOONCAKE_FILE: &str = "mooncake_synthetic_trace.jsonl";
/// The RAGPulse trace's file name (uncompressed).
pub const RAGPULSE_FILE: &str = "ragpulse_0_trace.jsonl";
/// The environment variable naming a directory of traces that overrides the default places.
pub const DATA_DIR_ENV: &str = "WARMPATH_DATA_DIR";
/// The extension a gzip-compressed trace adds to the trace's name.
const GZIP_EXTENSION: &str = "gz";

/// The directory holding the traces: `$WARMPATH_DATA_DIR` when set and not empty, else the
/// first that exists of `data/` in the source tree this binary was built from and `data/`
/// beside the running binary. The error names every place looked at.
pub fn data_dir() -> io::Result<PathBuf> {
    find_data_dir(std::env::var_os(DATA_DIR_ENV))
}

/// [`data_dir`] with the override given rather than read from the environment.
pub fn find_data_dir(override_dir: Option<OsString>) -> io::Result<PathBuf> {
    if let Some(dir) = override_dir.filter(|d| !d.is_empty()) {
        return first_dir(&[PathBuf::from(dir)], &format!("from {DATA_DIR_ENV}"));
    }
    let mut places = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("data")];
    // For an installed binary, whose source tree may be gone.
    places.extend(std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("data"))));
    first_dir(&places, &format!("{DATA_DIR_ENV} not set: the source tree, then beside the binary"))
}

/// The first of `places` that is a directory, or an error naming them all and `why` those.
fn first_dir(places: &[PathBuf], why: &str) -> io::Result<PathBuf> {
    if let Some(dir) = places.iter().find(|p| p.is_dir()) {
        return Ok(dir.clone());
    }
    let looked: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no trace directory: looked at {} ({why}); set {DATA_DIR_ENV} or --trace-dir to a \
             directory holding {MOONCAKE_FILE} and {RAGPULSE_FILE}, each possibly gzipped",
            looked.join(", ")
        ),
    ))
}

/// The trace `name` (e.g. [`MOONCAKE_FILE`]) in `dir`: `name` itself if it is there, else
/// `name.gz`; the error names both.
pub fn trace_file(dir: &Path, name: &str) -> io::Result<PathBuf> {
    let plain = dir.join(name);
    let gzipped = dir.join(format!("{name}.{GZIP_EXTENSION}"));
    [plain, gzipped].into_iter().find(|p| p.is_file()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "trace {name} not found: neither {name} nor {name}.{GZIP_EXTENSION} in {} \
                 (set {DATA_DIR_ENV} or --trace-dir to the directory holding the traces)",
                dir.display()
            ),
        )
    })
}

/// One Mooncake row.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct MooncakeRow {
    /// Milliseconds since the start of the trace.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens.
    pub output_length: u32,
    /// Prefix-block hashes, 512 tokens each (the last one partial).
    pub hash_ids: Vec<u64>,
}

/// One RAGPulse row (timestamp already parsed).
#[derive(Debug, Clone, PartialEq)]
pub struct RagRow {
    /// Seconds since the start of the trace.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens.
    pub output_length: u32,
    /// The session id.
    pub session_id: String,
    /// Chunk ids of the system prompt.
    pub system: Vec<u64>,
    /// Chunk ids of passages, history, web search and user input, in that order.
    pub user: Vec<u64>,
}

#[derive(Deserialize)]
struct RawRag {
    timestamp: serde_json::Value,
    input_length: u32,
    output_length: u32,
    session_id: String,
    hash_ids: RagIds,
}

#[derive(Deserialize)]
struct RagIds {
    #[serde(default)]
    sys_prompt: Vec<u64>,
    #[serde(default)]
    passages_ids: Vec<u64>,
    #[serde(default)]
    history: Vec<u64>,
    #[serde(default)]
    web_search: Vec<u64>,
    #[serde(default)]
    user_input: Vec<u64>,
}

fn bad(path: &Path, line: usize, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}:{line}: {what}", path.display()))
}

/// The text of the trace at `path`, decompressed when its extension is `gz` (one or more gzip
/// members; flate2 checks each member's CRC and length).
fn read(path: &Path) -> io::Result<String> {
    let gzipped = path.extension().is_some_and(|e| e == GZIP_EXTENSION);
    let mut text = String::new();
    let read = fs::File::open(path).and_then(|mut file| {
        if gzipped {
            MultiGzDecoder::new(file).read_to_string(&mut text)
        } else {
            file.read_to_string(&mut text)
        }
    });
    read.map(|_| text)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read trace {}: {e}", path.display())))
}

/// Reads the Mooncake trace at `path` (plain or `.gz`); blank lines are skipped.
pub fn read_mooncake(path: &Path) -> io::Result<Vec<MooncakeRow>> {
    let text = read(path)?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let row: MooncakeRow = serde_json::from_str(line).map_err(|e| bad(path, n + 1, e))?;
        if row.hash_ids.is_empty() {
            return Err(bad(path, n + 1, "no hash_ids"));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Reads the RAGPulse trace at `path` (plain or `.gz`): string (or numeric) timestamps, blank
/// lines skipped, rows sorted stably by timestamp.
pub fn read_ragpulse(path: &Path) -> io::Result<Vec<RagRow>> {
    let text = read(path)?;
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let raw: RawRag = serde_json::from_str(line).map_err(|e| bad(path, n + 1, e))?;
        let timestamp = match &raw.timestamp {
            serde_json::Value::String(s) => s.trim().parse::<f64>().ok(),
            serde_json::Value::Number(x) => x.as_f64(),
            _ => None,
        }
        .filter(|t| t.is_finite() && *t >= 0.0)
        .ok_or_else(|| bad(path, n + 1, format!("bad timestamp {}", raw.timestamp)))?;
        let ids = raw.hash_ids;
        let user = [ids.passages_ids, ids.history, ids.web_search, ids.user_input].concat();
        rows.push(RagRow {
            timestamp,
            input_length: raw.input_length,
            output_length: raw.output_length,
            session_id: raw.session_id,
            system: ids.sys_prompt,
            user,
        });
    }
    rows.sort_by(|a, b| a.timestamp.total_cmp(&b.timestamp));
    Ok(rows)
}

/// The parent of each Mooncake row (see the module doc), or None for a first turn.
pub fn mooncake_parents(rows: &[MooncakeRow]) -> Vec<Option<usize>> {
    let mut by_blocks: HashMap<&[u64], Vec<usize>> = HashMap::new();
    let mut parents = Vec::with_capacity(rows.len());
    for (b, row) in rows.iter().enumerate() {
        let ids = &row.hash_ids[..];
        let parent = (2..=ids.len()).rev().find_map(|k| {
            let candidates = by_blocks.get(&ids[..k])?;
            candidates.iter().rev().copied().find(|&a| rows[a].input_length < row.input_length)
        });
        parents.push(parent);
        let full = &ids[..ids.len() - 1];
        if full.len() >= 2 {
            by_blocks.entry(full).or_default().push(b);
        }
    }
    parents
}

/// Sessions as lists of row indices (in row order) from parent links: connected components.
pub fn sessions_of(parents: &[Option<usize>]) -> Vec<Vec<usize>> {
    let mut root = vec![0usize; parents.len()];
    let mut index_of_root: HashMap<usize, usize> = HashMap::new();
    let mut sessions: Vec<Vec<usize>> = Vec::new();
    for (i, parent) in parents.iter().enumerate() {
        // A parent always comes first, so its root is known.
        root[i] = parent.map_or(i, |p| root[p]);
        let s = *index_of_root.entry(root[i]).or_insert_with(|| {
            sessions.push(Vec::new());
            sessions.len() - 1
        });
        sessions[s].push(i);
    }
    sessions
}

fn offset(trace_seconds: f64, time_scale: f64) -> Duration {
    Duration::from_secs_f64((trace_seconds / time_scale).max(0.0))
}

/// The Mooncake replay: sessions derived from prefix links, compressed by `time_scale`.
pub fn mooncake(rows: &[MooncakeRow], time_scale: f64) -> Workload {
    assert!(time_scale > 0.0 && time_scale.is_finite(), "time scale must be positive");
    let parents = mooncake_parents(rows);
    let mut position = vec![0u32; rows.len()];
    let mut sessions = Vec::new();
    for members in sessions_of(&parents) {
        let mut turns = Vec::with_capacity(members.len());
        for (k, &i) in members.iter().enumerate() {
            position[i] = k as u32;
            let row = &rows[i];
            let full = (row.hash_ids.len() as u32 - 1) * BLOCK_WORDS;
            let last_words = row.input_length.saturating_sub(full).clamp(1, BLOCK_WORDS);
            turns.push(Turn {
                at: offset(row.timestamp / 1000.0, time_scale),
                after: parents[i].map(|p| position[p]),
                think: Duration::ZERO,
                max_tokens: row.output_length.max(1),
                prompt: Prompt::Blocks { ids: row.hash_ids.clone(), last_words },
            });
        }
        sessions.push(Session { id: format!("mooncake-{}", members[0]), seed: 0, turns });
    }
    Workload { name: "mooncake".into(), sessions, synthetic: None }
}

/// Splits `total` words over `count` chunks: equal shares, the last also the remainder.
fn shares(total: u32, count: usize) -> impl Iterator<Item = u32> {
    let n = count.max(1) as u32;
    let share = total / n;
    (0..count as u32).map(move |i| if i + 1 == n { total - share * (n - 1) } else { share })
}

/// The RAGPulse replay: explicit sessions, compressed by `time_scale`; `rows` in timestamp
/// order (as [`read_ragpulse`] returns them).
pub fn ragpulse(rows: &[RagRow], time_scale: f64) -> Workload {
    assert!(time_scale > 0.0 && time_scale.is_finite(), "time scale must be positive");
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut sessions: Vec<Session> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let s = *index.entry(&row.session_id).or_insert_with(|| {
            sessions.push(Session { id: row.session_id.clone(), seed: 0, turns: Vec::new() });
            sessions.len() - 1
        });
        let count = row.system.len() + row.user.len();
        let mut sizes = shares(row.input_length, count);
        let mut chunks = |ids: &[u64]| -> Vec<(u64, u32)> {
            ids.iter().map(|&id| (id, sizes.next().unwrap_or(0))).collect()
        };
        let system = chunks(&row.system);
        let mut user = chunks(&row.user);
        if count == 0 {
            // No chunk ids: text of its own, unshared.
            user.push((u64::MAX - i as u64, row.input_length));
        }
        let turns = &mut sessions[s].turns;
        turns.push(Turn {
            at: offset(row.timestamp, time_scale),
            after: turns.len().checked_sub(1).map(|p| p as u32),
            think: Duration::ZERO,
            max_tokens: row.output_length.max(1),
            prompt: Prompt::Chunks { system, user },
        });
    }
    Workload { name: "ragpulse".into(), sessions, synthetic: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Message;

    /// A trace found as `bench` finds it, or a failure saying where it was looked for.
    fn trace(file: &str) -> PathBuf {
        data_dir().and_then(|dir| trace_file(&dir, file)).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The sha256 sums `data/README.md` gives for the uncompressed source files.
    const SOURCE_SHA256: [(&str, &str); 2] = [
        (MOONCAKE_FILE, "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"),
        (RAGPULSE_FILE, "cd371571bef3320907147f8901729e37f412aafb067ec8eb153e2828e1801e65"),
    ];

    /// With `WARMPATH_DATA_DIR` ignored the traces come from the repository's `data/`,
    /// compressed, and decompress to the source files byte for byte, with their row counts.
    #[test]
    fn shipped_traces_are_the_source_files() {
        use sha2::{Digest, Sha256};
        let dir = find_data_dir(None).expect("a data directory");
        assert_eq!(dir, Path::new(env!("CARGO_MANIFEST_DIR")).join("data"));
        assert_eq!(find_data_dir(Some(OsString::new())).expect("empty is unset"), dir);
        let readme = fs::read_to_string(dir.join("README.md")).expect("data/README.md");
        for (file, sha256) in SOURCE_SHA256 {
            let path = trace_file(&dir, file).expect("shipped");
            assert_eq!(path, dir.join(format!("{file}.gz")), "{file} is shipped compressed");
            let text = read(&path).expect("decompresses");
            assert_eq!(format!("{:x}", Sha256::digest(text.as_bytes())), sha256, "{file}");
            assert!(readme.contains(&format!("{sha256}  {file}")), "data/README.md on {file}");
        }
        let mooncake = read_mooncake(&trace_file(&dir, MOONCAKE_FILE).expect("found"));
        assert_eq!(mooncake.expect("reads").len(), 3993);
        let ragpulse = read_ragpulse(&trace_file(&dir, RAGPULSE_FILE).expect("found"));
        assert_eq!(ragpulse.expect("reads").len(), 7106);
    }

    /// An override directory may hold a trace plain or gzipped (the plain file wins when both
    /// are there); what is missing or corrupt is an error that names it.
    #[test]
    fn override_dir_holds_plain_or_gzipped_traces() {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("warmpath-trace-dir-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let row = |t: u32, ids: &str| {
            format!("{{\"timestamp\": {t}, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [{ids}]}}\n")
        };
        let gzip = |text: &str| {
            let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
            encoder.write_all(text.as_bytes()).expect("compresses");
            encoder.finish().expect("compresses")
        };
        assert_eq!(find_data_dir(Some(dir.clone().into())).expect("the override"), dir);

        // Plain only, then both: the plain file is read.
        fs::write(dir.join(MOONCAKE_FILE), row(0, "1, 2") + &row(5, "1, 2, 3")).expect("write");
        let plain = trace_file(&dir, MOONCAKE_FILE).expect("found");
        assert_eq!(plain, dir.join(MOONCAKE_FILE));
        assert_eq!(read_mooncake(&plain).expect("reads").len(), 2);
        let gz = dir.join(format!("{MOONCAKE_FILE}.gz"));
        fs::write(&gz, gzip(&row(0, "7"))).expect("write");
        assert_eq!(trace_file(&dir, MOONCAKE_FILE).expect("found"), plain);

        // Gzipped only: decompressed; two gzip members in a row are one text.
        fs::remove_file(&plain).expect("remove");
        assert_eq!(trace_file(&dir, MOONCAKE_FILE).expect("found"), gz);
        let rows = read_mooncake(&gz).expect("decompresses");
        assert_eq!(rows.iter().map(|r| r.hash_ids.clone()).collect::<Vec<_>>(), [vec![7]]);
        let members = [gzip(&row(0, "7")), gzip(&row(1, "8, 9"))].concat();
        fs::write(&gz, members).expect("write");
        assert_eq!(read_mooncake(&gz).expect("decompresses").len(), 2);

        // A truncated gzip file is an error, not a shorter trace.
        let whole = gzip(&(row(0, "7") + &row(1, "8")));
        fs::write(&gz, &whole[..whole.len() - 4]).expect("write");
        let e = read_mooncake(&gz).expect_err("truncated");
        assert!(e.to_string().contains(&gz.display().to_string()), "{e}");

        // Missing: the trace's two names, the directories looked at.
        let e = trace_file(&dir, RAGPULSE_FILE).expect_err("no RAGPulse here");
        let both = format!("neither {RAGPULSE_FILE} nor {RAGPULSE_FILE}.gz in {}", dir.display());
        assert!(e.to_string().contains(&both), "{e}");
        let missing = dir.join("missing");
        let e = find_data_dir(Some(missing.clone().into())).expect_err("no such directory");
        assert!(e.to_string().contains(&missing.display().to_string()), "{e}");
        let places = [dir.join("a"), dir.join("b")];
        let e = first_dir(&places, "test").expect_err("neither exists");
        for place in &places {
            assert!(e.to_string().contains(&place.display().to_string()), "{e}");
        }
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    fn close(actual: f64, expected: f64, what: &str) {
        assert!(
            (actual - expected).abs() <= 0.03 * expected,
            "{what}: {actual}, expected about {expected}"
        );
    }

    #[test]
    fn mooncake_sessions_match_the_readme() {
        let rows = read_mooncake(&trace(MOONCAKE_FILE)).expect("reads");
        assert_eq!(rows.len(), 3993);
        assert!(rows.iter().all(|r| r.hash_ids.len() == r.input_length.div_ceil(512) as usize));
        let parents = mooncake_parents(&rows);
        let follow_ups = parents.iter().flatten().count();
        close(follow_ups as f64, 1060.0, "follow-ups");
        let sessions = sessions_of(&parents);
        let multi: Vec<usize> = sessions.iter().map(Vec::len).filter(|&n| n > 1).collect();
        close(multi.len() as f64, 388.0, "multi-turn sessions");
        close(multi.iter().sum::<usize>() as f64 / multi.len() as f64, 3.7, "mean turns");
        assert_eq!(multi.iter().max(), Some(&15));
        // The parent covers a median 98 % of a follow-up.
        let mut cover: Vec<f64> = parents
            .iter()
            .enumerate()
            .filter_map(|(b, p)| p.map(|a| (a, b)))
            .map(|(a, b)| f64::from(rows[a].input_length) / f64::from(rows[b].input_length))
            .collect();
        cover.sort_by(f64::total_cmp);
        close(cover[cover.len() / 2], 0.98, "median parent coverage");

        let w = mooncake(&rows, 10.0);
        assert_eq!(w.requests(), 3993);
        assert_eq!(w.follow_ups(), follow_ups);
        let last = rows.last().expect("rows").timestamp / 1000.0 / 10.0;
        let max_at = w.sessions.iter().flat_map(|s| &s.turns).map(|t| t.at).max();
        assert_eq!(max_at, Some(offset(last * 10.0, 10.0)));
    }

    #[test]
    fn mooncake_follow_up_text_extends_the_parent_conversation() {
        let rows = read_mooncake(&trace(MOONCAKE_FILE)).expect("reads");
        let w = mooncake(&rows, 1.0);
        let words_in = |messages: &[Message]| -> usize {
            messages.iter().map(|m| m.content.split(' ').count()).sum()
        };
        let mut checked = 0;
        for (s, session) in w.sessions.iter().enumerate() {
            for (t, turn) in session.turns.iter().enumerate() {
                let Some(parent) = turn.after else { continue };
                let (child, parent) = (w.messages(s, t), w.messages(s, parent as usize));
                // The parent's messages as sent, then one more: a next turn of a chat.
                assert_eq!(child[..parent.len()], parent[..], "session {s} turn {t}");
                assert_eq!(child.len(), parent.len() + 1);
                let Prompt::Blocks { ids, .. } = &turn.prompt else { panic!("blocks") };
                let row = rows.iter().find(|r| &r.hash_ids == ids).expect("the child's row");
                assert_eq!(words_in(&child), row.input_length as usize, "a token is a word");
                checked += 1;
            }
            if checked > 200 {
                break;
            }
        }
        assert!(checked > 0, "the trace has follow-ups");
        // A first turn is one user message of its blocks; a different id, different text.
        let single = w.sessions.iter().position(|x| x.turns.len() == 1).expect("a single turn");
        let root = w.sessions.iter().position(|x| x.turns.len() > 1).expect("a session");
        let first_block =
            |m: &[Message]| m[0].content.split(' ').take(512).collect::<Vec<_>>().join(" ");
        assert_ne!(first_block(&w.messages(single, 0)), first_block(&w.messages(root, 0)));
    }

    #[test]
    fn ragpulse_quirks() {
        let path = trace(RAGPULSE_FILE);
        let text = read(&path).expect("reads");
        assert!(text.ends_with("\n\n"), "the file ends with a blank line");
        let rows = read_ragpulse(&path).expect("reads despite the blank line");
        assert_eq!(rows.len(), 7106);
        assert!(rows.windows(2).all(|w| w[0].timestamp <= w[1].timestamp), "sorted");
        // The file itself has exactly one pair out of order.
        let raw: Vec<f64> = text
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                v["timestamp"].as_str().expect("a string timestamp").parse().expect("a number")
            })
            .collect();
        assert_eq!(raw.windows(2).filter(|w| w[0] > w[1]).count(), 1);

        let w = ragpulse(&rows, 1000.0);
        assert_eq!(w.sessions.len(), 3990);
        let multi: Vec<usize> =
            w.sessions.iter().map(|s| s.turns.len()).filter(|&n| n > 1).collect();
        assert_eq!(multi.len(), 1643);
        assert_eq!(multi.iter().max(), Some(&25));
        close(multi.iter().sum::<usize>() as f64 / multi.len() as f64, 2.9, "mean turns");
        for s in &w.sessions {
            for (k, t) in s.turns.iter().enumerate() {
                assert_eq!(t.after, k.checked_sub(1).map(|p| p as u32));
                assert!(k == 0 || s.turns[k - 1].at <= t.at);
            }
        }
        // Seven days compressed 1000 times: about ten minutes.
        let end = w.sessions.iter().flat_map(|s| &s.turns).map(|t| t.at).max().expect("turns");
        assert!(end > Duration::from_secs(590) && end < Duration::from_secs(620), "{end:?}");
        // Each chunk gets its share; the words add up to the input length.
        let first = &rows[0];
        let messages = w.messages(0, 0);
        let total: usize = messages.iter().map(|m| m.content.split(' ').count()).sum();
        assert_eq!(total, first.input_length as usize);
        assert_eq!(messages[0].role, "system");
        assert_eq!(first.system.len(), 3);
    }

    #[test]
    fn ragpulse_reader_takes_numeric_and_string_timestamps() {
        let dir = std::env::temp_dir().join(format!("warmpath-rag-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("t.jsonl");
        let ids = r#""hash_ids": {"sys_prompt": [1], "passages_ids": [], "history": [], "web_search": [], "user_input": [2]}"#;
        let body = format!(
            "{{\"timestamp\": \"5\", \"input_length\": 10, \"output_length\": 2, \"session_id\": \"a\", {ids}}}\n\
             {{\"timestamp\": 3.5, \"input_length\": 7, \"output_length\": 2, \"session_id\": \"b\", {ids}}}\n\
             {{\"timestamp\": \"5\", \"input_length\": 9, \"output_length\": 2, \"session_id\": \"a\", {ids}}}\n\n"
        );
        fs::write(&path, body).expect("write");
        let rows = read_ragpulse(&path).expect("reads");
        let order: Vec<(f64, u32)> = rows.iter().map(|r| (r.timestamp, r.input_length)).collect();
        assert_eq!(order, vec![(3.5, 7), (5.0, 10), (5.0, 9)], "stable sort");
        let w = ragpulse(&rows, 1.0);
        assert_eq!(w.sessions[1].turns[1].after, Some(0));
        let m = w.messages(1, 0);
        assert_eq!((m[0].content.split(' ').count(), m[1].content.split(' ').count()), (5, 5));
        fs::write(&path, "{\"timestamp\": \"x\", \"input_length\": 1, \"output_length\": 1, \"session_id\": \"a\", \"hash_ids\": {}}\n").expect("write");
        assert!(read_ragpulse(&path).is_err());
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// What `bench --anonymous` relies on (issue \[10\]): every Mooncake follow-up, as sent,
    /// holds among its conversation ends the end of its parent's whole prompt, so a router
    /// that derives sessions can find every one.
    #[test]
    fn every_mooncake_follow_up_holds_its_parents_end() {
        let rows = read_mooncake(&trace(MOONCAKE_FILE)).expect("reads");
        let w = mooncake(&rows, 1.0);
        let ends = |s: usize, t: usize| {
            let mut body = Vec::new();
            w.write_body(s, t, "m", (false, true), &mut body);
            let mut hasher = crate::protocol::PromptHasher::new(256);
            hasher.hash_body(&body, &mut Vec::new());
            hasher.ends()
        };
        let mut follow_ups = 0;
        for (s, session) in w.sessions.iter().enumerate() {
            for (t, turn) in session.turns.iter().enumerate() {
                let Some(parent) = turn.after else { continue };
                let parent_end = ends(s, parent as usize).whole().expect("a chat prompt's end");
                assert!(ends(s, t).earlier().contains(&parent_end), "session {s} turn {t}");
                follow_ups += 1;
            }
        }
        assert_eq!(follow_ups, 1060);
    }
}
