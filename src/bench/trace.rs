//! Replays of the two real traces in `../shared/data/` (see its README).
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
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::workload::{Prompt, Session, Turn, Workload, BLOCK_WORDS};

/// The Mooncake trace's file name.
pub const MOONCAKE_FILE: &str = "mooncake_synthetic_trace.jsonl";
/// The RAGPulse trace's file name.
pub const RAGPULSE_FILE: &str = "ragpulse_0_trace.jsonl";

/// Where the traces are: `$WARMPATH_DATA_DIR` if set, else `../shared/data` next to the source
/// tree this binary was built from.
pub fn data_dir() -> PathBuf {
    match std::env::var_os("WARMPATH_DATA_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data"),
    }
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

fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot read trace {}: {e} (set WARMPATH_DATA_DIR or --trace-dir to the \
                 directory holding the traces)",
                path.display()
            ),
        )
    })
}

/// Reads the Mooncake trace; blank lines are skipped.
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

/// Reads the RAGPulse trace: string (or numeric) timestamps, blank lines skipped, rows sorted
/// stably by timestamp.
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

    /// The traces, or a failure saying where they were looked for.
    fn trace(file: &str) -> PathBuf {
        let path = data_dir().join(file);
        assert!(
            path.is_file(),
            "trace {} not found: the bench tests need ../shared/data next to the repository, or \
             WARMPATH_DATA_DIR set to a directory holding {MOONCAKE_FILE} and {RAGPULSE_FILE}",
            path.display()
        );
        path
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
    fn mooncake_follow_up_text_extends_the_parent_blocks() {
        let rows = read_mooncake(&trace(MOONCAKE_FILE)).expect("reads");
        let w = mooncake(&rows, 1.0);
        let (s, t) = w
            .sessions
            .iter()
            .enumerate()
            .find_map(|(s, sess)| sess.turns.iter().position(|t| t.after.is_some()).map(|t| (s, t)))
            .expect("a follow-up");
        let parent = w.sessions[s].turns[t].after.expect("follow-up") as usize;
        let child_text = &w.messages(s, t)[0].content;
        let parent_text = &w.messages(s, parent)[0].content;
        let Prompt::Blocks { ids, last_words } = &w.sessions[s].turns[parent].prompt else {
            panic!("a Mooncake prompt is blocks");
        };
        let full_words = (ids.len() - 1) * 512;
        let parent_words: Vec<&str> = parent_text.split(' ').collect();
        let child_words: Vec<&str> = child_text.split(' ').collect();
        assert_eq!(parent_words.len(), full_words + *last_words as usize);
        assert_eq!(parent_words[..full_words], child_words[..full_words]);
        let Prompt::Blocks { ids: child_ids, .. } = &w.sessions[s].turns[t].prompt else {
            panic!("a Mooncake prompt is blocks");
        };
        let words_in = |text: &str| text.split(' ').count();
        let row = rows.iter().find(|r| &r.hash_ids == child_ids).expect("the child's row");
        assert_eq!(words_in(child_text), row.input_length as usize, "a token is a word");
        // A different id gives different text.
        let first_block = |text: &str| text.split(' ').take(512).collect::<Vec<_>>().join(" ");
        let other = w.sessions.iter().position(|x| x.turns.len() == 1).expect("a single turn");
        assert_ne!(first_block(&w.messages(other, 0)[0].content), first_block(child_text));
    }

    #[test]
    fn ragpulse_quirks() {
        let path = trace(RAGPULSE_FILE);
        let text = fs::read_to_string(&path).expect("reads");
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
}
