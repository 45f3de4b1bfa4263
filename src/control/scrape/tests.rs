use super::*;

const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3-8B"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3-8B"} 5.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3-8B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3-8B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3-8B"} 0.125
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.7453e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3-8B"} 1.234567e+06
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3-8B"} 120.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3-8B"} 120.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3-8B"} 20.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
process_start_time_seconds 1.74529e+09
"#;

const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 0.5
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 345.6
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 0.42
"#;

fn parse(kind: EngineKind, text: &[u8]) -> Result<EngineGauges, ScrapeError> {
    parse_gauges(kind, text, &ScrapeLimits::default())
}

fn vllm(text: &str) -> Result<EngineGauges, ScrapeError> {
    parse(EngineKind::Vllm, text.as_bytes())
}

fn gauges(waiting: f64, running: f64, cache_usage: f64) -> EngineGauges {
    EngineGauges { waiting: Some(waiting), running: Some(running), cache_usage: Some(cache_usage) }
}

fn waiting(value: f64) -> EngineGauges {
    EngineGauges { waiting: Some(value), ..EngineGauges::default() }
}

const WAITING: &str = "vllm:num_requests_waiting";

#[test]
fn vllm_sample_sums_the_series_of_each_family() {
    assert_eq!(vllm(VLLM), Ok(gauges(7.0, 7.0, 0.375)));
    assert_eq!(vllm(VLLM).unwrap().waiting_count(), Some(7));
}

#[test]
fn sglang_sample() {
    assert_eq!(parse(EngineKind::Sglang, SGLANG.as_bytes()), Ok(gauges(7.0, 12.0, 0.5)));
}

#[test]
fn each_engine_reads_only_its_own_families() {
    assert_eq!(parse(EngineKind::Sglang, VLLM.as_bytes()), Ok(EngineGauges::default()));
    assert_eq!(vllm(SGLANG), Ok(EngineGauges::default()));
    assert_eq!(vllm(""), Ok(EngineGauges::default()));
}

#[test]
fn older_vllm_cache_name_is_a_fallback() {
    let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n\
               vllm:gpu_cache_usage_perc{model_name=\"n\"} 0.25\n";
    assert_eq!(vllm(old).unwrap().cache_usage, Some(0.75));
    let both = format!("{old}vllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.125\n");
    assert_eq!(vllm(&both).unwrap().cache_usage, Some(0.125));
    let new_first = format!("vllm:kv_cache_usage_perc 0\n{old}");
    assert_eq!(vllm(&new_first).unwrap().cache_usage, Some(0.0));
    // The fallback's lines are still checked: a malformed one fails the scrape.
    let bad_old = "vllm:kv_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc oops\n";
    let family = "vllm:gpu_cache_usage_perc";
    assert_eq!(vllm(bad_old), Err(ScrapeError::Malformed { line: 2, family }));
}

#[test]
fn families_match_whole_names_only() {
    let text = "vllm:num_requests_waiting_total 9\n\
                vllm:num_requests_waitingX{a=\"b\"} 9\n\
                vllm:num_requests_waiting:x 9\n\
                vllm:num_requests_wait 9\n\
                xvllm:num_requests_waiting 9\n\
                vllm:num_requests_waiting-bad 9\n\
                vllm:num_requests_waiting_total{garbage\n";
    assert_eq!(vllm(text), Ok(EngineGauges::default()));
    assert_eq!(vllm(&format!("{text}{WAITING} 2\n")), Ok(waiting(2.0)));
}

#[test]
fn label_values_may_hold_escapes_braces_commas_and_blanks() {
    let lines = [
        r#"vllm:num_requests_waiting{model_name="a} b, \"c\" \\ d\ne",engine="0"} 1"#,
        r#"vllm:num_requests_waiting{ model_name = "x" , engine="1", } 1"#,
        r#"vllm:num_requests_waiting{} 1"#,
        r#"vllm:num_requests_waiting {engine="2"}	1"#,
        r#"vllm:num_requests_waiting{engine="3"}1"#,
        r#"vllm:num_requests_waiting{a="\\"} 1"#,
        "vllm:num_requests_waiting{a=\"\u{e9}\u{4e2d}\"} 1",
        "  \tvllm:num_requests_waiting 1 \t",
    ];
    for line in lines {
        assert_eq!(vllm(line), Ok(waiting(1.0)), "{line}");
    }
    assert_eq!(vllm(&lines.join("\n")), Ok(waiting(8.0)));
    let non_utf8 = b"vllm:num_requests_waiting{a=\"\xff\xfe\"} 1";
    assert_eq!(parse(EngineKind::Vllm, non_utf8), Ok(waiting(1.0)));
}

#[test]
fn values_and_timestamps() {
    for (value, expected) in [("1", 1.0), ("1.5e3", 1500.0), ("+2", 2.0), ("0", 0.0), ("3.", 3.0)] {
        assert_eq!(vllm(&format!("{WAITING} {value}")), Ok(waiting(expected)), "{value}");
    }
    assert_eq!(vllm(&format!("{WAITING} -0")).unwrap().waiting_count(), Some(0));
    for timestamp in ["1712345678901", "-5", "0", "+7"] {
        let line = format!("{WAITING}{{engine=\"0\"}} 4 {timestamp}");
        assert_eq!(vllm(&line), Ok(waiting(4.0)), "{line}");
    }
}

#[test]
fn crlf_and_blank_lines_are_tolerated() {
    let crlf = VLLM.replace('\n', "\r\n");
    assert_eq!(vllm(&crlf), Ok(gauges(7.0, 7.0, 0.375)));
    let blanks = format!("\n\n  \n\t\r\n{WAITING} 3\r\n\r\n");
    assert_eq!(vllm(&blanks), Ok(waiting(3.0)));
    assert_eq!(vllm(&format!("{WAITING} 3\r")), Ok(waiting(3.0)));
}

#[test]
fn garbage_and_non_utf8_in_unrelated_lines_are_skipped() {
    let mut body = b"\xff\xfe\x00garbage line\n{\"json\": true}\nfoo{bar=\"unclosed 1\n".to_vec();
    body.extend_from_slice(b"vllm:other\xff 1\nvllm:other{a=\"\\q\"} NaN\nbar -Inf\n");
    body.extend_from_slice(b"# TYPE vllm:num_requests_waiting \xff\n=== \t\n");
    body.extend_from_slice(format!("{}\n{}", "x".repeat(100_000), VLLM).as_bytes());
    assert_eq!(parse(EngineKind::Vllm, &body), Ok(gauges(7.0, 7.0, 0.375)));
}

#[test]
fn malformed_lines_of_needed_families_are_errors() {
    let bodies = [
        WAITING.to_string(),
        format!("{WAITING} "),
        format!("{WAITING}{{engine=\"0\"}}"),
        format!("{WAITING}{{engine=\"0\" 1"),
        format!("{WAITING}{{engine=\"0}} 1"),
        format!("{WAITING}{{engine=0}} 1"),
        format!("{WAITING}{{engine=\"\\t\"}} 1"),
        format!("{WAITING}{{0engine=\"0\"}} 1"),
        format!("{WAITING}{{engine-x=\"0\"}} 1"),
        format!("{WAITING}{{engine=\"0\" model=\"m\"}} 1"),
        format!("{WAITING}{{,}} 1"),
        format!("{WAITING}{{engine}} 1"),
        format!("{WAITING} abc"),
        format!("{WAITING} 1 2 3"),
        format!("{WAITING} 1 1.5"),
        format!("{WAITING} 1 ts"),
        format!("{WAITING} 0x10"),
        format!("{WAITING} 1_000"),
        format!("{WAITING}\t{{a=\"b\"}} 1 }}"),
    ];
    for body in &bodies {
        let family = WAITING;
        assert_eq!(vllm(body), Err(ScrapeError::Malformed { line: 1, family }), "{body}");
    }
    let non_utf8_value = b"vllm:num_requests_running 1\xff";
    let family = "vllm:num_requests_running";
    let error = ScrapeError::Malformed { line: 1, family };
    assert_eq!(parse(EngineKind::Vllm, non_utf8_value), Err(error));
}

#[test]
fn nan_infinite_and_negative_values_are_errors() {
    for value in ["NaN", "nan", "+Inf", "-Inf", "inf", "-1", "-0.5", "1e400"] {
        for family in ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"] {
            let body = format!("# TYPE {family} gauge\n{family}{{engine=\"0\"}} {value}\n");
            assert_eq!(vllm(&body), Err(ScrapeError::BadValue { line: 2, family }), "{body}");
        }
    }
    let family = "sglang:num_queue_reqs";
    let body = format!("{family} 1\n{family} NaN\n");
    let error = ScrapeError::BadValue { line: 2, family };
    assert_eq!(parse(EngineKind::Sglang, body.as_bytes()), Err(error));
}

#[test]
fn a_sum_that_overflows_is_an_error() {
    let body = format!("{WAITING}{{a=\"1\"}} 1e308\n{WAITING}{{a=\"2\"}} 1e308\n");
    assert_eq!(vllm(&body), Err(ScrapeError::BadValue { line: 2, family: WAITING }));
}

#[test]
fn the_first_error_wins_and_names_its_line() {
    let body = format!("{VLLM}{WAITING} x\n{WAITING} NaN\n");
    let line = VLLM.lines().count() + 1;
    assert_eq!(vllm(&body), Err(ScrapeError::Malformed { line, family: WAITING }));
    let message = vllm(&body).unwrap_err().to_string();
    assert!(message.contains(&format!("line {line}")) && message.contains(WAITING), "{message}");
}

#[test]
fn long_lines_are_refused_only_in_needed_families() {
    let limits = ScrapeLimits { line_bytes_max: 64, ..ScrapeLimits::default() };
    let labels = "x".repeat(64);
    let other = format!("vllm:other{{a=\"{labels}\"}} 1\n");
    let ours = format!("{WAITING}{{a=\"{labels}\"}} 1\n");
    let parsed = parse_gauges(EngineKind::Vllm, other.as_bytes(), &limits);
    assert_eq!(parsed, Ok(EngineGauges::default()));
    let parsed = parse_gauges(EngineKind::Vllm, format!("{other}{ours}").as_bytes(), &limits);
    assert_eq!(parsed, Err(ScrapeError::LineTooLong { line: 2, family: WAITING }));
    // The limit counts the line without its CRLF, inclusive.
    let exact = format!("{WAITING} {}\r\n", "0".repeat(64 - WAITING.len() - 1));
    assert_eq!(parse_gauges(EngineKind::Vllm, exact.as_bytes(), &limits), Ok(waiting(0.0)));
}

#[test]
fn a_body_over_the_limit_is_refused_before_it_is_read() {
    // The first line would be malformed: the limit is checked before any line is read.
    let mut body = format!("{WAITING} x\n").into_bytes();
    body.resize(10 << 20, b'#');
    let error = ScrapeError::BodyTooLarge { body_bytes: 10 << 20, body_bytes_max: 4 << 20 };
    assert_eq!(parse(EngineKind::Vllm, &body), Err(error));
    let limits = ScrapeLimits { body_bytes_max: VLLM.len(), ..ScrapeLimits::default() };
    assert!(parse_gauges(EngineKind::Vllm, VLLM.as_bytes(), &limits).is_ok());
    let limits = ScrapeLimits { body_bytes_max: VLLM.len() - 1, ..limits };
    let parsed = parse_gauges(EngineKind::Vllm, VLLM.as_bytes(), &limits);
    assert!(matches!(parsed, Err(ScrapeError::BodyTooLarge { .. })));
}

#[test]
fn waiting_count_rounds_and_saturates() {
    for (value, expected) in [
        (0.0, 0),
        (2.4, 2),
        (2.5, 3),
        (7.0, 7),
        (4e9, 4_000_000_000),
        (5e9, u32::MAX),
        (1e300, u32::MAX),
    ] {
        assert_eq!(waiting(value).waiting_count(), Some(expected), "{value}");
    }
    assert_eq!(EngineGauges::default().waiting_count(), None);
}

#[test]
fn engine_kinds_follow_the_configured_engine() {
    assert_eq!(EngineKind::for_engine(Engine::Vllm), Some(EngineKind::Vllm));
    assert_eq!(EngineKind::for_engine(Engine::Sglang), Some(EngineKind::Sglang));
    assert_eq!(EngineKind::for_engine(Engine::Openai), None);
}

#[test]
fn properties_hold_on_samples_and_edge_cases() {
    let cases: [&[u8]; 9] = [
        VLLM.as_bytes(),
        SGLANG.as_bytes(),
        b"",
        b"\n",
        b"vllm:num_requests_waiting 1",
        b"vllm:num_requests_waiting NaN",
        b"sglang:token_usage{a=\"\\",
        b"vllm:kv_cache_usage_perc 1e308\nvllm:kv_cache_usage_perc 1e308",
        b"\xff\nvllm:num_requests_running{a=\"}\"} 2 3\n",
    ];
    for case in cases {
        check_properties(case);
    }
}
