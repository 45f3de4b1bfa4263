//! `warmpath::bench` end to end against a tiny fake OpenAI server in this file (std threads on
//! 127.0.0.1:0, one per connection, keep-alive): it streams a few SSE chunks per chat request,
//! records when each request arrived and when its response was written, and serves
//! `/metrics` counters that grow with every request. The tests check what the driver promises:
//! a follow-up is sent only after its predecessor's response ended, and not before its think
//! time (synthetic) or its own offset (traces); TTFT is measured; the report files are written.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::thread;
use std::time::Duration;

use warmpath::bench::{self, MultiTurn, Prompt, RunOptions, Session, Turn, Workload};
use warmpath::clock::{Clock, Tick};

/// One chat request as the fake server saw it.
#[derive(Debug, Clone)]
struct Seen {
    session: String,
    /// The `Authorization` header's value, or empty.
    authorization: String,
    /// Messages in the prompt: turn k of a synthetic session has 2 + 2k.
    messages: usize,
    /// It asked for a streamed response.
    stream: bool,
    arrived: Tick,
    answered: Tick,
}

struct Fake {
    url: String,
    clock: Clock,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// Chunks per response and the pause before each.
const CHUNKS: usize = 4;
const CHUNK_GAP: Duration = Duration::from_millis(3);

impl Fake {
    fn start() -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let clock = Clock::real();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let counters = Arc::new(Mutex::new((0u64, 0u64)));
        let (c, s) = (clock.clone(), Arc::clone(&seen));
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (c, s, n) = (c.clone(), Arc::clone(&s), Arc::clone(&counters));
                thread::spawn(move || serve(stream, &c, &s, &n));
            }
        });
        Fake { url, clock, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }
}

/// A request head as the fake server reads it.
struct Head {
    request_line: String,
    length: usize,
    session: String,
    authorization: String,
}

/// Reads the next request head; `None` when the client has closed.
fn read_head(reader: &mut BufReader<TcpStream>) -> Option<Head> {
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return None;
    }
    let request_line = line.trim_end().to_owned();
    let (mut length, mut session, mut authorization) = (0usize, String::new(), String::new());
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        let header = line.trim_end();
        if header.is_empty() {
            return Some(Head { request_line, length, session, authorization });
        }
        let (name, value) = header.split_once(':').expect("a header line");
        match name.to_ascii_lowercase().as_str() {
            "content-length" => length = value.trim().parse().expect("a length"),
            "x-session-id" => session = value.trim().to_owned(),
            "authorization" => authorization = value.trim().to_owned(),
            _ => {}
        }
    }
}

/// Serves one keep-alive connection until the client closes it.
fn serve(stream: TcpStream, clock: &Clock, seen: &Mutex<Vec<Seen>>, counters: &Mutex<(u64, u64)>) {
    // As real servers do: without it, Nagle holds each chunk for the client's delayed ACK.
    stream.set_nodelay(true).expect("nodelay");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut out = stream;
    loop {
        let Some(Head { request_line, length, session, authorization }) = read_head(&mut reader)
        else {
            return;
        };
        let arrived = clock.now();
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        if request_line.starts_with("GET /metrics") {
            let (hits, queries) = *counters.lock().expect("lock");
            let text = format!(
                "# TYPE vllm:prefix_cache_hits_total counter\n\
                 vllm:prefix_cache_hits_total{{model_name=\"m\"}} {hits}.0\n\
                 vllm:prefix_cache_queries_total{{model_name=\"m\"}} {queries}.0\n"
            );
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len());
            let _ = out.write_all(format!("{head}{text}").as_bytes());
            continue;
        }
        assert!(request_line.starts_with("POST /v1/chat/completions "), "{request_line}");
        let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
        let stream = json["stream"] == true;
        assert_eq!(json["stream_options"]["include_usage"] == true, stream, "{json}");
        let messages = json["messages"].as_array().expect("messages").len();
        {
            let mut c = counters.lock().expect("lock");
            c.0 += 5;
            c.1 += 10;
        }
        if stream && !stream_events(&mut out) {
            return;
        }
        if !stream {
            // The whole answer at once, after as long as the chunks of a stream take.
            thread::sleep(CHUNK_GAP * CHUNKS as u32);
        }
        let answered = clock.now();
        // Recorded before the last bytes go out: the client cannot have seen the end earlier.
        let request = Seen { session, authorization, messages, stream, arrived, answered };
        seen.lock().expect("lock").push(request);
        if out.write_all(last_bytes(stream).as_bytes()).is_err() {
            return;
        }
    }
}

/// Writes a stream's head and its content events, a chunk gap apart; false when the client
/// has gone.
fn stream_events(out: &mut TcpStream) -> bool {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    if out.write_all(head.as_bytes()).is_err() {
        return false;
    }
    for k in 0..CHUNKS {
        thread::sleep(CHUNK_GAP);
        let event = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"w{k} \"}}}}]}}\n\n");
        let _ = out.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
    }
    true
}

/// The end of an answer: a stream's usage event, `[DONE]` and last chunk, or a whole response.
fn last_bytes(stream: bool) -> String {
    if stream {
        let last = format!(
            "data: {{\"choices\":[],\"usage\":{{\"completion_tokens\":{CHUNKS}}}}}\n\ndata: [DONE]\n\n"
        );
        return format!("{:x}\r\n{last}\r\n0\r\n\r\n", last.len());
    }
    let text = format!(
        "{{\"choices\":[{{\"message\":{{\"content\":\"w\"}}}}],\"usage\":{{\"completion_tokens\":{CHUNKS}}}}}"
    );
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
    format!("{head}Content-Length: {}\r\n\r\n{text}", text.len())
}

fn options(label: &str) -> RunOptions {
    RunOptions { model: "m".into(), label: label.into(), ..RunOptions::default() }
}

/// Clock calibration differs slightly between two `Clock::real()`s: half a millisecond of slack.
const SLACK: Duration = Duration::from_micros(500);

/// The tests of this file run in parallel threads; the one that checks send times against the
/// clock (`paced_sends_are_at_their_intended_times`) takes this for writing, so it runs with no
/// other test of the file beside it on a 2-core machine, and every other test takes it for
/// reading. A test that failed while holding it does not fail the others (poisoning ignored).
static MACHINE: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn synthetic_sessions_keep_order_and_think_times() {
    let _shared = shared();
    let fake = Fake::start();
    let params = MultiTurn {
        rate: 40.0,
        duration: Duration::from_millis(300),
        turns: 3,
        system_words: 20,
        context_words: 50,
        new_words: 10,
        answer_tokens: 8,
        think_mean: Duration::from_millis(40),
        seed: 7,
    };
    let workload = params.workload();
    assert!(workload.sessions.len() >= 5, "{} sessions", workload.sessions.len());
    let mut opts = options("synthetic");
    opts.engine_metrics = vec![format!("{}/metrics", fake.url)];
    let result = bench::run_workload(&fake.url, &workload, &opts).expect("runs");

    assert_eq!(result.all.requests as usize, workload.requests());
    assert_eq!(result.all.ok, result.all.requests, "errors: {:?}", result.errors);
    assert_eq!(result.follow_ups.requests as usize, workload.follow_ups());
    assert!(result.samples.iter().all(|s| s.ttft_ms.is_some_and(|t| t > 0.0)));
    assert!(result.samples.iter().all(|s| s.output_tokens == CHUNKS as u32));
    let ttft = result.first_turns.ttft_ms.expect("first-turn TTFT");
    assert!(ttft.p50 >= CHUNK_GAP.as_secs_f64() * 1000.0, "TTFT {ttft:?} under one chunk gap");
    assert!(result.follow_ups.itl_ms.is_some_and(|p| p.p50 >= 2.0), "{:?}", result.follow_ups);
    let cache = result.prefix_cache.as_ref().expect("scraped");
    assert_eq!(cache.hit_rate, Some(0.5));
    assert_eq!(cache.queries, 10.0 * workload.requests() as f64);

    let rate = fake.clock.rate();
    let mut by_session: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
    for s in fake.seen() {
        by_session.entry(s.session.clone()).or_default().push(s);
    }
    assert_eq!(by_session.len(), workload.sessions.len(), "every request carries its session");
    for session in &workload.sessions {
        let mut seen = by_session.remove(&session.id).expect("the session was seen");
        seen.sort_by_key(|s| s.messages);
        let turns: Vec<usize> = seen.iter().map(|s| (s.messages - 2) / 2).collect();
        assert_eq!(turns, vec![0, 1, 2], "session {}", session.id);
        for k in 1..seen.len() {
            let (prev, next) = (&seen[k - 1], &seen[k]);
            assert!(next.arrived >= prev.answered, "turn {k} of {} overlapped", session.id);
            let gap = rate.duration(next.arrived - prev.answered);
            let think = session.turns[k].think;
            assert!(gap + SLACK >= think, "{}: gap {gap:?} < think {think:?}", session.id);
        }
    }

    let dir = std::env::temp_dir().join(format!("warmpath-bench-{}", std::process::id()));
    let mut second = result.clone();
    second.label = "again".into();
    let written = bench::write_report(&dir, &[result, second], "ttft.svg").expect("writes");
    assert_eq!(written.len(), 3);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("synthetic.json")).expect("json written"))
            .expect("valid JSON");
    assert!(json["follow_ups"]["ttft_ms"]["p99"].as_f64().is_some_and(|p| p > 0.0));
    assert_eq!(json["prefix_cache"]["hit_rate"], 0.5);
    let svg = std::fs::read_to_string(dir.join("ttft.svg")).expect("svg written");
    assert!(svg.starts_with("<svg") && svg.contains("follow-ups") && svg.contains("again"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Small two-turn sessions arriving at 40 a second for `duration`.
fn two_turn_sessions(duration: Duration, seed: u64) -> Workload {
    let params = MultiTurn {
        rate: 40.0,
        duration,
        turns: 2,
        system_words: 20,
        context_words: 30,
        new_words: 5,
        answer_tokens: 4,
        think_mean: Duration::from_millis(5),
        seed,
    };
    params.workload()
}

/// `--anonymous` (issue [10]): the same turns, in the same order, with no session header, so a
/// router can only tell a conversation by its prompt.
#[test]
fn anonymous_runs_send_no_session_header() {
    let _shared = shared();
    let fake = Fake::start();
    let workload = two_turn_sessions(Duration::from_millis(200), 11);
    let mut opts = options("anonymous");
    opts.anonymous = true;
    let result = bench::run_workload(&fake.url, &workload, &opts).expect("runs");
    assert_eq!(result.all.ok as usize, workload.requests(), "errors: {:?}", result.errors);
    assert_eq!(result.follow_ups.requests as usize, workload.follow_ups());
    let seen = fake.seen();
    assert_eq!(seen.len(), workload.requests());
    assert!(seen.iter().all(|s| s.session.is_empty()), "a session header was sent");
    // Each session's second turn still resends its first (2 + 2k messages at turn k).
    let second_turns = seen.iter().filter(|s| s.messages == 4).count();
    assert_eq!(second_turns, workload.follow_ups());
}

/// `--no-stream=50`: half the sessions, the same ones every run, ask for whole responses and
/// the others stream; every turn of a session asks the same way, and each sample says which.
#[test]
fn a_share_of_sessions_asks_for_whole_responses() {
    let _shared = shared();
    let fake = Fake::start();
    let workload = two_turn_sessions(Duration::from_millis(400), 13);
    let mut opts = options("mixed");
    opts.unstreamed_percent = 50;
    let result = bench::run_workload(&fake.url, &workload, &opts).expect("runs");
    assert_eq!(result.all.ok as usize, workload.requests(), "errors: {:?}", result.errors);
    let streams = |s: usize| bench::workload::session_streams(s, 50);
    for sample in &result.samples {
        assert_eq!(sample.stream, streams(sample.session as usize), "{sample:?}");
        let (ttft, e2e) = (sample.ttft_ms.expect("answered"), sample.e2e_ms);
        // A whole response's first token is its end; a stream's comes a few chunks earlier.
        assert_eq!(ttft == e2e, !sample.stream, "{sample:?}");
    }
    let streamed = result.samples.iter().filter(|s| s.stream).count();
    assert!(streamed > 0 && streamed < result.samples.len(), "{streamed} streamed");
    let mut by_session: BTreeMap<String, Vec<bool>> = BTreeMap::new();
    for seen in fake.seen() {
        by_session.entry(seen.session).or_default().push(seen.stream);
    }
    for (s, session) in workload.sessions.iter().enumerate() {
        assert_eq!(by_session[&session.id], vec![streams(s); 2], "session {}", session.id);
    }
}

/// `--no-stream` alone is every session; `--no-stream=PERCENT` a share of them, 0 to 100.
#[test]
fn no_stream_takes_an_optional_share() {
    use clap::Parser;
    let parse = |extra: &[&str]| {
        let mut args = vec!["bench", "--target", "http://127.0.0.1:9", "--no-progress"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).map(|cli| cli.bench.no_stream)
    };
    assert_eq!(parse(&[]).expect("parses"), None);
    assert_eq!(parse(&["--no-stream"]).expect("parses"), Some(100));
    assert_eq!(parse(&["--no-stream=30"]).expect("parses"), Some(30));
    assert_eq!(parse(&["--no-stream=0"]).expect("parses"), Some(0));
    for bad in ["--no-stream=101", "--no-stream=-1", "--no-stream=half"] {
        assert!(parse(&[bad]).is_err(), "{bad}");
    }
}

/// `--api-key` (issue [11]'s tenants): every request carries `Authorization: Bearer KEY`, beside
/// its session header; without it, none does.
#[test]
fn an_api_key_goes_on_every_request() {
    let _shared = shared();
    let fake = Fake::start();
    let workload = two_turn_sessions(Duration::from_millis(150), 12);
    let mut opts = options("keyed");
    opts.api_key = Some("wp_test-key_1".into());
    let result = bench::run_workload(&fake.url, &workload, &opts).expect("runs");
    assert_eq!(result.all.ok as usize, workload.requests(), "errors: {:?}", result.errors);
    let seen = fake.seen();
    assert_eq!(seen.len(), workload.requests());
    assert!(seen.iter().all(|s| s.authorization == "Bearer wp_test-key_1"), "{seen:?}");
    assert!(seen.iter().all(|s| !s.session.is_empty()), "the session header is still sent");
    let unkeyed = bench::run_workload(&fake.url, &workload, &options("unkeyed")).expect("runs");
    assert_eq!(unkeyed.all.ok as usize, workload.requests());
    assert!(fake.seen()[seen.len()..].iter().all(|s| s.authorization.is_empty()));
}

fn blocks_turn(at_ms: u64, after: Option<u32>, ids: Vec<u64>) -> Turn {
    Turn {
        at: Duration::from_millis(at_ms),
        after,
        think: Duration::ZERO,
        max_tokens: 4,
        prompt: Prompt::Blocks { ids, last_words: 10 },
    }
}

#[test]
fn trace_turns_wait_for_their_offset_and_their_parent() {
    let _shared = shared();
    let fake = Fake::start();
    // Session a: a follow-up due before its parent can have finished (waits for the parent),
    // and one due well after (waits for its offset). Session b: a tree (two children of 0).
    let workload = Workload {
        name: "trace".into(),
        synthetic: None,
        sessions: vec![
            Session {
                id: "a".into(),
                seed: 0,
                turns: vec![
                    blocks_turn(0, None, vec![1, 2]),
                    blocks_turn(1, Some(0), vec![1, 2, 3]),
                    blocks_turn(150, Some(1), vec![1, 2, 3, 4]),
                ],
            },
            Session {
                id: "b".into(),
                seed: 0,
                turns: vec![
                    blocks_turn(20, None, vec![9, 8]),
                    blocks_turn(21, Some(0), vec![9, 8, 7]),
                    blocks_turn(22, Some(0), vec![9, 8, 6]),
                ],
            },
        ],
    };
    let start = fake.clock.now();
    let result = bench::run_workload(&fake.url, &workload, &options("trace")).expect("runs");
    assert_eq!((result.all.ok, result.follow_ups.ok), (6, 4));
    let rate = fake.clock.rate();
    let seen = fake.seen();
    // Every prompt here is one user message; tell turns apart by arrival within a session.
    let arrivals = |id: &str| -> Vec<&Seen> {
        let mut v: Vec<&Seen> = seen.iter().filter(|s| s.session == id).collect();
        v.sort_by_key(|s| s.arrived);
        v
    };
    let a = arrivals("a");
    assert_eq!(a.len(), 3);
    for (k, s) in a.iter().enumerate() {
        let offset = workload.sessions[0].turns[k].at;
        assert!(rate.duration(s.arrived - start) + SLACK >= offset, "turn {k} of a came early");
    }
    assert!(a[1].arrived >= a[0].answered && a[2].arrived >= a[1].answered);
    let b = arrivals("b");
    assert_eq!(b.len(), 3);
    assert!(b[1].arrived >= b[0].answered && b[2].arrived >= b[0].answered);
}

#[test]
fn a_dead_target_is_counted_not_hung() {
    let _shared = shared();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let workload = MultiTurn {
        rate: 50.0,
        duration: Duration::from_millis(100),
        turns: 2,
        think_mean: Duration::ZERO,
        ..MultiTurn::default()
    }
    .workload();
    let result = bench::run_workload(&url, &workload, &options("dead")).expect("runs");
    assert_eq!(result.all.ok, 0);
    assert_eq!(result.errors.get("io").copied(), Some(workload.requests() as u64));
}

/// `warmpath bench` as the command line will call it.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    bench: bench::BenchArgs,
}

#[test]
fn command_line_replays_mooncake_and_writes_the_report() {
    let _shared = shared();
    use clap::Parser;
    let dir = bench::trace::data_dir().unwrap_or_else(|e| panic!("{e}"));
    bench::trace::trace_file(&dir, bench::trace::MOONCAKE_FILE).unwrap_or_else(|e| panic!("{e}"));
    let fake = Fake::start();
    let dir = std::env::temp_dir().join(format!("warmpath-bench-cli-{}", std::process::id()));
    let metrics = format!("{}/metrics", fake.url);
    let cli = Cli::try_parse_from([
        "bench",
        "--target",
        &fake.url,
        "--model",
        "m",
        "--workload",
        "mooncake",
        "--max-requests",
        "30",
        "--time-scale",
        "100",
        "--engine-metrics",
        &metrics,
        "--label",
        "mooncake replay",
        "--out",
        dir.to_str().expect("utf-8 path"),
        "--no-progress",
    ])
    .expect("parses");
    let code = bench::run(&cli.bench);
    assert_eq!(format!("{code:?}"), format!("{:?}", std::process::ExitCode::SUCCESS));
    assert_eq!(fake.seen().len(), 30);
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("mooncake_replay.json")).expect("json written"),
    )
    .expect("valid JSON");
    assert_eq!(json["workload"], "mooncake");
    assert_eq!(json["all"]["ok"], 30);
    assert!(std::fs::read_to_string(dir.join("mooncake_replay-ttft.svg"))
        .expect("svg written")
        .contains("TTFT"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
    let bad = Cli::try_parse_from(["bench", "--target", "http://x", "--workload", "nope"]);
    assert!(bad.is_err());
}

/// Runs the built binary's `bench` against `fake` with `args`, the traces found from
/// `WARMPATH_DATA_DIR` = `data_dir`, or as an installed binary finds them when it is None.
fn bench_binary(fake: &Fake, data_dir: Option<&Path>, args: &[&str]) -> Output {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-binary");
    let mut command = Command::new(env!("CARGO_BIN_EXE_warmpath"));
    command.args(["bench", "--target", &fake.url, "--no-progress", "--out"]).arg(&out).args(args);
    match data_dir {
        Some(dir) => command.env(bench::trace::DATA_DIR_ENV, dir),
        None => command.env_remove(bench::trace::DATA_DIR_ENV),
    };
    command.output().expect("the binary runs")
}

/// A clone of the repository replays both traces with nothing beside it and nothing in the
/// environment: they come from its own `data/`.
#[test]
fn binary_replays_the_shipped_traces_with_no_environment() {
    let _shared = shared();
    let fake = Fake::start();
    for (workload, scale) in [("mooncake", "1000"), ("ragpulse", "1000000")] {
        let args = ["--workload", workload, "--time-scale", scale, "--max-requests", "3"];
        let output = bench_binary(&fake, None, &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{workload}: {stderr}");
        assert!(stderr.contains(&format!("{workload}: ")), "{stderr}");
        assert!(stderr.contains(" 3 requests "), "{stderr}");
    }
    assert_eq!(fake.seen().len(), 6);
}

/// `WARMPATH_DATA_DIR` overrides the shipped traces, and may hold a plain `.jsonl`; one that
/// does not exist is an error naming it.
#[test]
fn binary_reads_a_plain_trace_from_the_override_directory() {
    let _shared = shared();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-override");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let row = |t: &str, session: &str| {
        format!(
            "{{\"timestamp\": \"{t}\", \"input_length\": 20, \"output_length\": 4, \
             \"session_id\": \"{session}\", \"hash_ids\": {{\"sys_prompt\": [1], \
             \"user_input\": [2]}}}}\n"
        )
    };
    let trace = row("0", "s1") + &row("1", "s2") + &row("2", "s1");
    std::fs::write(dir.join(bench::trace::RAGPULSE_FILE), trace).expect("write");
    let fake = Fake::start();
    let output = bench_binary(&fake, Some(&dir), &["--workload", "ragpulse"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("ragpulse: 2 sessions, 3 requests (1 follow-ups)"), "{stderr}");
    let mut sessions: Vec<String> = fake.seen().into_iter().map(|s| s.session).collect();
    sessions.sort();
    assert_eq!(sessions, ["s1", "s1", "s2"]);

    let missing = dir.join("missing");
    let output = bench_binary(&fake, Some(&missing), &["--workload", "ragpulse"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Against the simulated engine: follow-ups hit the prefix cache their first turn filled (the
/// prompts extend each other), and their TTFT shows it.
#[test]
fn against_the_simulated_engine_follow_ups_hit_the_prefix_cache() {
    let _shared = shared();
    let sim = warmpath::sim::start(warmpath::sim::SimOptions::new()).expect("sim starts");
    let url = format!("http://{}", sim.addr());
    let workload = MultiTurn {
        rate: 10.0,
        duration: Duration::from_millis(500),
        turns: 3,
        system_words: 200,
        context_words: 1500,
        new_words: 30,
        answer_tokens: 8,
        think_mean: Duration::from_millis(20),
        seed: 3,
    }
    .workload();
    let mut opts = options("sim");
    opts.model = "sim-8b".into();
    opts.engine_metrics = vec![format!("{url}/metrics")];
    let result = bench::run_workload(&url, &workload, &opts).expect("runs");
    sim.stop();
    assert_eq!(result.all.ok as usize, workload.requests(), "errors: {:?}", result.errors);
    let rate = result.prefix_cache.as_ref().and_then(|c| c.hit_rate).expect("a hit rate");
    assert!(rate > 0.5, "prefix-cache hit rate {rate}");
    let first = result.first_turns.ttft_ms.expect("first turns").p50;
    let follow = result.follow_ups.ttft_ms.expect("follow-ups").p50;
    assert!(follow < first, "follow-up TTFT p50 {follow} ms, first turns {first} ms");
    eprintln!("{}", bench::table(std::slice::from_ref(&result)));
}

// --- fixed-rate: the paced, open-loop generator -------------------------------------------

/// A fake non-streaming chat server for paced runs: one thread per connection, each request
/// numbered in arrival order; `answer(n)` gives the status of request `n` and how long to hold
/// its response (a hold stalls that connection only).
struct Paced {
    url: String,
    arrivals: Arc<Mutex<Vec<Tick>>>,
}

type Answer = fn(usize) -> (u16, Duration);

impl Paced {
    fn start(answer: Answer) -> Paced {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let a = Arc::clone(&arrivals);
        let clock = Clock::real();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (a, clock) = (Arc::clone(&a), clock.clone());
                thread::spawn(move || serve_paced(stream, &clock, &a, answer));
            }
        });
        Paced { url, arrivals }
    }

    fn arrivals(&self) -> Vec<Tick> {
        self.arrivals.lock().expect("lock").clone()
    }
}

fn serve_paced(stream: TcpStream, clock: &Clock, arrivals: &Mutex<Vec<Tick>>, answer: Answer) {
    stream.set_nodelay(true).expect("nodelay");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /v1/chat/completions "), "{line}");
        let mut length = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            match line.trim_end().split_once(':') {
                Some((name, value)) if name.eq_ignore_ascii_case("content-length") => {
                    length = value.trim().parse().expect("a length");
                }
                None => break,
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).expect("body");
        let n = {
            let mut a = arrivals.lock().expect("lock");
            a.push(clock.now());
            a.len() - 1
        };
        let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
        assert_eq!(json["model"], "m");
        let (status, hold) = answer(n);
        thread::sleep(hold);
        let text = r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}"#;
        let response =
            format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{text}", text.len());
        if out.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn paced(rate: f64, duration_ms: u64, connections: usize, max: usize) -> bench::FixedRate {
    bench::FixedRate {
        rate,
        duration: Duration::from_millis(duration_ms),
        arrivals: bench::Arrivals::Constant,
        seed: 1,
        connections,
        connections_max: max,
        body: bench::fixed_rate::small_body("m", false),
        request_timeout: Duration::from_secs(5),
        label: "paced".into(),
        api_key: None,
    }
}

const MS: u64 = 1_000_000;

/// Sends go out at their intended times: as many as rate × duration, spread evenly over the
/// window as the server sees them. Tolerances are for a loaded 2-core machine: the median gap
/// between arrivals within 20 % of the interval (a descheduled generator sends a burst, which
/// moves a few gaps, not the median), the generator's median send lag under 1 ms.
#[test]
fn paced_sends_are_at_their_intended_times() {
    let _alone = MACHINE.write().unwrap_or_else(|e| e.into_inner());
    let server = Paced::start(|_| (200, Duration::ZERO));
    let result = bench::run_fixed_rate(&server.url, &paced(400.0, 1000, 4, 64)).expect("runs");
    assert_eq!((result.planned, result.sent, result.ok), (400, 400, 400), "{:?}", result.errors);
    assert_eq!(result.late, 0);
    let arrivals = server.arrivals();
    assert_eq!(arrivals.len(), 400);
    let rate = Clock::real().rate();
    let mut gaps: Vec<Duration> = arrivals.windows(2).map(|w| rate.duration(w[1] - w[0])).collect();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    assert!(
        median.abs_diff(Duration::from_micros(2500)) < Duration::from_micros(500),
        "{median:?}"
    );
    let span = rate.duration(arrivals[399] - arrivals[0]);
    assert!(span.abs_diff(Duration::from_micros(997_500)) < Duration::from_millis(50), "{span:?}");
    let lag = result.send_lag_us.expect("sends were made");
    assert!(lag.p50 < 1000.0, "send lag {lag:?}");
    let latency = result.latency_us.expect("latencies");
    assert!(latency.p50 <= latency.p999 && latency.p999 <= latency.max);
    assert!(result.samples.iter().all(|s| s.lag_ns.is_some_and(|l| s.latency_ns >= l)));
    assert!((result.sent_per_s - 400.0).abs() < 40.0, "{}", result.sent_per_s);

    let poisson =
        bench::FixedRate { arrivals: bench::Arrivals::Poisson, ..paced(400.0, 500, 4, 64) };
    let expected = poisson.offsets().len() as u64;
    let result = bench::run_fixed_rate(&server.url, &poisson).expect("runs");
    assert_eq!((result.arrivals, result.planned, result.ok), ("poisson", expected, expected));
}

/// The coordinated-omission check: one connection, and the server holds one response for
/// 250 ms. The sends due meanwhile wait for the connection (late), go out afterwards, and
/// their latency, measured from their intended time, carries the wait: the stall shows as
/// latency growing with it, not as fewer requests. Their service time (what a closed-loop tool
/// measures) stays short.
#[test]
fn a_stalled_server_shows_as_latency_not_as_fewer_sends() {
    let _shared = shared();
    let server = Paced::start(|n| (200, Duration::from_millis(if n == 20 { 250 } else { 0 })));
    let result = bench::run_fixed_rate(&server.url, &paced(200.0, 1000, 1, 1)).expect("runs");
    assert_eq!((result.planned, result.sent, result.ok), (200, 200, 200), "{:?}", result.errors);
    assert_eq!(server.arrivals().len(), 200);
    // 50 sends are due during the hold; each found the only connection busy.
    assert!(result.late >= 40, "late {}", result.late);
    let slow: Vec<_> = result.samples.iter().filter(|s| s.latency_ns >= 100 * MS).collect();
    // Those due in the first 150 ms of the hold (about 30) waited at least 100 ms.
    assert!(slow.len() >= 25, "{} requests over 100 ms", slow.len());
    let mut service: Vec<u64> =
        slow.iter().filter(|s| s.waited).filter_map(|s| s.service_ns).collect();
    service.sort_unstable();
    assert!(service[service.len() / 2] < 50 * MS, "waited requests' service {:?}", &service[..5]);
    let tail = result.latency_us.expect("latencies");
    assert!(tail.max >= 250_000.0 && result.service_us.expect("service").p50 < 50_000.0);
}

/// The same stall with a pool: the generator sends the next requests on other connections, on
/// time; only the held request is slow.
#[test]
fn a_slow_response_does_not_delay_the_next_send() {
    let _shared = shared();
    let server = Paced::start(|n| (200, Duration::from_millis(if n == 20 { 250 } else { 0 })));
    let result = bench::run_fixed_rate(&server.url, &paced(200.0, 1000, 2, 64)).expect("runs");
    assert_eq!((result.sent, result.ok, result.late), (200, 200, 0), "{:?}", result.errors);
    let mut by_latency = result.samples.clone();
    by_latency.sort_by_key(|s| std::cmp::Reverse(s.latency_ns));
    assert!(by_latency[0].latency_ns >= 250 * MS, "{:?}", by_latency[0]);
    // The requests due right after the held one went out on time (a 50 ms margin).
    let held = by_latency[0].offset_ns;
    let next: Vec<_> = result
        .samples
        .iter()
        .filter(|s| s.offset_ns > held && s.offset_ns <= held + 100 * MS)
        .collect();
    assert_eq!(next.len(), 20);
    assert!(next.iter().all(|s| s.lag_ns.is_some_and(|l| l < 50 * MS)), "{next:?}");
    assert!(result.latency_us.expect("latencies").p50 < 50_000.0);
}

#[test]
fn paced_errors_are_counted_by_status_and_kind() {
    let _shared = shared();
    let server = Paced::start(|n| (if n % 4 == 3 { 500 } else { 200 }, Duration::ZERO));
    let result = bench::run_fixed_rate(&server.url, &paced(400.0, 500, 2, 64)).expect("runs");
    assert_eq!((result.planned, result.ok), (200, 150));
    assert_eq!(result.errors.get("500"), Some(&50));
    assert!(bench::rate_table(std::slice::from_ref(&result)).contains("errors: 500: 50"));

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let result = bench::run_fixed_rate(&url, &paced(200.0, 250, 2, 8)).expect("runs");
    assert_eq!((result.planned, result.sent, result.ok), (50, 0, 0));
    assert_eq!(result.errors.get("io"), Some(&50));
    assert!(result.notes.iter().any(|n| n.contains("0 of 2 connections")), "{:?}", result.notes);
}

/// The binary: a paced run prints its table and writes its JSON; bad arguments exit 2.
#[test]
fn binary_runs_fixed_rate_and_refuses_bad_arguments() {
    let _shared = shared();
    let server = Paced::start(|_| (200, Duration::ZERO));
    let fake = Fake { url: server.url.clone(), clock: Clock::real(), seen: Arc::default() };
    let base = ["--workload", "fixed-rate", "--model", "m", "--label", "paced-cli"];
    let output =
        bench_binary(&fake, None, &[&base[..], &["--rate", "200", "--duration", "500ms"]].concat());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("send lag") && stdout.contains("100 of 100 sent"), "{stdout}");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-binary");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("paced-cli.json")).expect("json written"))
            .expect("valid JSON");
    assert_eq!((json["planned"].as_u64(), json["ok"].as_u64()), (Some(100), Some(100)));
    assert!(json["latency_us"]["p999"].as_f64().is_some_and(|p| p > 0.0), "{json}");
    assert!(json.get("samples").is_none());
    assert_eq!(server.arrivals().len(), 100);

    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("paced-body.json");
    std::fs::write(&file, br#"{"model":"m","messages":[]}"#).expect("write");
    let file = file.to_str().expect("utf-8");
    for bad in [
        &["--rate", "0"][..],
        &["--rate", "nan"],
        &["--connections", "0"],
        &["--connections", "300"],
        &["--duration", "0s"],
        &["--rate", "1000000", "--duration", "60s"],
        &["--body", "/nonexistent/body.json"],
        &["--body", file, "--stream"],
        &["--arrivals", "bursty"],
        &["--api-key", "two words"],
        &["--api-key", "line\r\nX-Injected: 1"],
        &["--api-key", ""],
    ] {
        let output = bench_binary(&fake, None, &[&base[..], bad].concat());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains("error"), "{bad:?}: {stderr}");
    }
    assert_eq!(server.arrivals().len(), 100, "a refused run sent nothing");
    let output = bench_binary(
        &fake,
        None,
        &[&base[..], &["--body", file, "--rate", "100", "--duration", "100ms"]].concat(),
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(server.arrivals().len(), 110);
}

/// `--load` paces multiturn as it paces a trace: arrivals and think times compressed by the
/// factor that makes the workload offer that share of the engines' capacity (times the sims'
/// time scale), and every session of the generation window sent, however far the compression
/// stretches it. Fixed-rate, which has no load to scale, refuses it.
#[test]
fn load_paces_multiturn_and_is_refused_for_fixed_rate() {
    use clap::Parser;
    let parse = |extra: &[&str]| {
        let mut args = vec!["bench", "--target", "http://127.0.0.1:9", "--no-progress"];
        args.extend_from_slice(extra);
        Cli::try_parse_from(args).expect("parses").bench
    };
    let multiturn =
        ["--workload", "multiturn", "--rate", "4", "--duration", "20s", "--think-ms", "2000"];
    let plain = bench::build_workload(&parse(&multiturn)).expect("a workload");
    let profile = warmpath::sim::profile("l4-3b").expect("a profile");
    for (load, sim_scale) in [("0.05", "1"), ("0.9", "8")] {
        let mut args = multiturn.to_vec();
        args.extend(["--load", load, "--engine-profile", "l4-3b", "--engine-profile", "l4-3b"]);
        args.extend(["--sim-scale", sim_scale]);
        let paced = bench::build_workload(&parse(&args)).expect("a paced workload");
        let factor =
            bench::load::compression_for(&plain, &[profile, profile], load.parse().unwrap())
                * sim_scale.parse::<f64>().unwrap();
        assert_eq!(paced.requests(), plain.requests(), "load {load}: every session is sent");
        for (a, b) in plain.sessions.iter().zip(&paced.sessions) {
            for (t, u) in a.turns.iter().zip(&b.turns) {
                let close = |x: Duration, y: Duration| {
                    (x.as_secs_f64() / factor - y.as_secs_f64()).abs() < 1e-6
                };
                assert!(close(t.at, u.at) && close(t.think, u.think), "load {load}: {t:?} {u:?}");
            }
        }
    }
    let mut fixed = vec!["--workload", "fixed-rate", "--load", "0.5"];
    fixed.extend(["--engine-profile", "l4-3b"]);
    let code = bench::run(&parse(&fixed));
    assert_eq!(format!("{code:?}"), format!("{:?}", std::process::ExitCode::from(2)));
}
