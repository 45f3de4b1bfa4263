use super::reference::check_properties;
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
    EngineGauges {
        waiting: Some(waiting),
        running: Some(running),
        cache_usage: Some(cache_usage),
        ..EngineGauges::default()
    }
}

fn waiting(value: f64) -> EngineGauges {
    EngineGauges { waiting: Some(value), ..EngineGauges::default() }
}

const WAITING: &str = "vllm:num_requests_waiting";

#[test]
fn vllm_sample_sums_the_series_of_each_family_and_averages_the_kv_usage() {
    // Two data-parallel engines, each with its own KV cache: 0.25 and 0.125 in use.
    assert_eq!(vllm(VLLM), Ok(gauges(7.0, 7.0, 0.1875)));
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
    assert_eq!(vllm(old).unwrap().cache_usage, Some(0.375));
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
    assert_eq!(vllm(&crlf), Ok(gauges(7.0, 7.0, 0.1875)));
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
    assert_eq!(parse(EngineKind::Vllm, &body), Ok(gauges(7.0, 7.0, 0.1875)));
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
    let cases: [&[u8]; 15] = [
        VLLM.as_bytes(),
        SGLANG.as_bytes(),
        VLLM_CACHE.as_bytes(),
        SGLANG_CACHE.as_bytes(),
        b"vllm:cache_config_info{num_gpu_blocks=\"7\",block_size=\"16\"} 1",
        b"vllm:cache_config_info{kv_cache_size_tokens=\"1\\2\",num_gpu_blocks=\"3\",block_size=\"4\"} 1",
        b"vllm:cache_config_info{block_size=\"99999999999\",num_gpu_blocks=\"99999999999\"} 1\n\
          vllm:cache_config_info{kv_cache_size_tokens=\"18446744073709551615\"} 1",
        b"sglang:prompt_tokens_total 10\nsglang:max_total_num_tokens{a=\"b\"} 4e5 12",
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

/// A vLLM body with what it says about its caches: two data-parallel engines, the prefix-cache
/// counters under their new and their deprecated names, and the counters' `_created` series.
const VLLM_CACHE: &str = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27648",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="1",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="27648",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 120000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 80000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7453e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 90000.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 30000.0
# HELP vllm:gpu_prefix_cache_queries_total GPU prefix cache queries. DEPRECATED
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{engine="0",model_name="m"} 1.0
# HELP vllm:gpu_prefix_cache_hits_total GPU prefix cache hits. DEPRECATED
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 1.0
"#;

/// An SGLang body with its KV pool size and token counters (the cached-tokens counter not yet
/// created: no request has hit the cache).
const SGLANG_CACHE: &str = r#"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="q",pp_rank="0",tp_rank="0"} 3.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="q",pp_rank="0",tp_rank="0"} 662256.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="q"} 4096.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="q",pp_rank="0",tp_rank="0"} 0.0
"#;

const INFO: &str = "vllm:cache_config_info";

fn capacity(text: &str) -> Option<f64> {
    vllm(&format!("{WAITING} 2\n{text}")).unwrap().kv_capacity_tokens
}

#[test]
fn vllm_cache_fields_are_summed_over_engines() {
    let gauges = vllm(VLLM_CACHE).unwrap();
    assert_eq!(gauges.waiting, Some(1.0));
    assert_eq!(gauges.kv_capacity_tokens, Some(2.0 * 27648.0 * 16.0));
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (Some(200_000.0), Some(120_000.0)));
    let cache = gauges.cache(TickRate::NANOS);
    assert_eq!(cache.kv_capacity_tokens, 884_736);
    assert_eq!((cache.prefix_queries, cache.prefix_hits), (200_000, 120_000));
    // Bodies without them: nothing known but the KV usage.
    let usage = EngineCache { kv_usage_micro: 187_500, ..EngineCache::UNKNOWN };
    assert_eq!(vllm(VLLM).unwrap().cache(TickRate::NANOS), usage);
}

#[test]
fn older_vllm_prefix_counter_names_are_a_fallback() {
    let old = "vllm:gpu_prefix_cache_queries_total{engine=\"0\"} 10\n\
               vllm:gpu_prefix_cache_hits_total{engine=\"0\"} 4\n";
    let gauges = vllm(old).unwrap();
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (Some(10.0), Some(4.0)));
    let both = format!("{old}vllm:prefix_cache_queries_total 20\nvllm:prefix_cache_hits_total 5\n");
    let gauges = vllm(&both).unwrap();
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (Some(20.0), Some(5.0)));
    // Counters are summed families: a malformed line fails the scrape, as for the gauges.
    let family = "vllm:prefix_cache_hits_total";
    let bad = format!("{WAITING} 1\n{family}{{engine=\"0\"}} many\n");
    assert_eq!(vllm(&bad), Err(ScrapeError::Malformed { line: 2, family }));
    let negative = format!("{family} -3\n");
    assert_eq!(vllm(&negative), Err(ScrapeError::BadValue { line: 1, family }));
}

#[test]
fn vllm_capacity_prefers_kv_cache_size_tokens() {
    let line = |labels: &str| format!("{INFO}{{{labels}}} 1\n");
    let newer = line(
        "block_size=\"16\",kv_cache_max_concurrency=\"2.58203125\",\
         kv_cache_size_tokens=\"10576\",num_gpu_blocks=\"661\",engine=\"0\"",
    );
    assert_eq!(capacity(&newer), Some(10576.0));
    // A hybrid model: the group-aware size differs from blocks × block size, and wins.
    let hybrid = line("num_gpu_blocks=\"100\",block_size=\"16\",kv_cache_size_tokens=\"800\"");
    assert_eq!(capacity(&hybrid), Some(800.0));
    // Not set yet: the blocks.
    let unset = line("kv_cache_size_tokens=\"None\",num_gpu_blocks=\"100\",block_size=\"16\"");
    assert_eq!(capacity(&unset), Some(1600.0));
    // Label order, blanks, a trailing comma and other escapes do not matter.
    let spaced = line(" model=\"a \\\"b\\\"\" , block_size = \"32\" ,num_gpu_blocks=\"0010\", ");
    assert_eq!(capacity(&spaced), Some(320.0));
}

#[test]
fn a_strange_info_gauge_leaves_the_capacity_unknown_and_fails_nothing() {
    let line = |labels: &str| format!("{INFO}{{{labels}}} 1\n");
    let strange = [
        line("num_gpu_blocks=\"None\",block_size=\"16\""),
        line("block_size=\"16\""),
        line("num_gpu_blocks=\"100\""),
        line(""),
        format!("{INFO} 1\n"),
        line("num_gpu_blocks=\"-100\",block_size=\"16\""),
        line("num_gpu_blocks=\"+100\",block_size=\"16\""),
        line("num_gpu_blocks=\"1e3\",block_size=\"16\""),
        line("num_gpu_blocks=\"\",block_size=\"16\""),
        line("num_gpu_blocks=\" 100\",block_size=\"16\""),
        line("num_gpu_blocks=\"1\\n0\",block_size=\"16\""),
        line("num_gpu_blocks=\"100\",block_size=\"16\",block_size=\"16\""),
        line("kv_cache_size_tokens=\"5\",kv_cache_size_tokens=\"5\""),
        line("num_gpu_blocks=\"100\",block_size=\"16\"").replace("} 1", "} one"),
        line("num_gpu_blocks=\"100\",block_size=\"16\"").replace("} 1", "} 1 2 3"),
        line("num_gpu_blocks=\"100\",block_size=16"),
        line("num_gpu_blocks=\"100\",block_size=\"16"),
        line("num_gpu_blocks=\"100\",block_size=\"\\t\""),
        line("num_gpu_blocks=\"18446744073709551616\",block_size=\"1\""),
        line("num_gpu_blocks=\"4294967296\",block_size=\"4294967296\""),
        line("kv_cache_size_tokens=\"18446744073709551615\"")
            + &line("block_size=\"1\",num_gpu_blocks=\"1\""),
    ];
    for text in &strange {
        assert_eq!(capacity(text), None, "{text}");
        // One good series beside a strange one: a partial sum would under-report.
        let good = line("num_gpu_blocks=\"100\",block_size=\"16\"");
        assert_eq!(capacity(&format!("{good}{text}")), None, "{text}");
        assert_eq!(capacity(&format!("{text}{good}")), None, "{text}");
        assert_eq!(capacity(&good), Some(1600.0));
    }
    // Too long: unknown, where a long line of a summed family fails the scrape.
    let limits = ScrapeLimits { line_bytes_max: 64, ..ScrapeLimits::default() };
    let long =
        line(&format!("num_gpu_blocks=\"100\",block_size=\"16\",pad=\"{}\"", "x".repeat(64)));
    let parsed = parse_gauges(EngineKind::Vllm, format!("{WAITING} 2\n{long}").as_bytes(), &limits);
    assert_eq!(parsed, Ok(waiting(2.0)));
    let short = line("num_gpu_blocks=\"100\",block_size=\"16\"");
    let parsed = parse_gauges(EngineKind::Vllm, short.as_bytes(), &limits).unwrap();
    assert_eq!(parsed.kv_capacity_tokens, Some(1600.0));
    // The info gauge's value is not read.
    assert_eq!(
        capacity(&line("num_gpu_blocks=\"1\",block_size=\"2\"").replace("} 1", "} NaN")),
        Some(2.0)
    );
}

#[test]
fn sglang_cache_fields() {
    let gauges = parse(EngineKind::Sglang, SGLANG_CACHE.as_bytes()).unwrap();
    assert_eq!(gauges.waiting, Some(3.0));
    assert_eq!(gauges.kv_capacity_tokens, Some(662_256.0));
    // No cached-tokens series yet beside prompt tokens: no hit so far.
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (Some(4096.0), Some(0.0)));
    let hit = format!("{SGLANG_CACHE}sglang:cached_tokens_total{{model_name=\"q\"}} 1024.0\n");
    let gauges = parse(EngineKind::Sglang, hit.as_bytes()).unwrap();
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (Some(4096.0), Some(1024.0)));
    // Without the prompt-token counter neither is known; the hit-rate gauge is not a counter.
    let gauges = parse(EngineKind::Sglang, SGLANG.as_bytes()).unwrap();
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (None, None));
    let usage = EngineCache { kv_usage_micro: 500_000, ..EngineCache::UNKNOWN };
    assert_eq!(gauges.cache(TickRate::NANOS), usage, "only its token usage");
    // vLLM's absent hits stay unknown: its counters exist from the start.
    let gauges = vllm("vllm:prefix_cache_queries_total 7\n").unwrap();
    assert_eq!((gauges.prefix_queries, gauges.prefix_hits), (Some(7.0), None));
}

#[test]
fn preemption_counters_are_summed_over_engines() {
    let two = "vllm:num_preemptions_total{engine=\"0\",model_name=\"m\"} 3.0\n\
               vllm:num_preemptions_total{engine=\"1\",model_name=\"m\"} 4.0\n";
    assert_eq!(vllm(two).unwrap().preemptions, Some(7.0));
    assert_eq!(vllm(two).unwrap().cache(TickRate::NANOS).preemptions, 7);
    // SGLang's retraction counter is its preemption counter; its older gauge is not read.
    let sglang = format!(
        "{SGLANG}sglang:num_retracted_requests_total{{model_name=\"q\"}} 5\n\
         sglang:num_retracted_reqs{{model_name=\"q\"}} 2\n"
    );
    let gauges = parse(EngineKind::Sglang, sglang.as_bytes()).unwrap();
    assert_eq!(gauges.preemptions, Some(5.0));
    assert_eq!(parse(EngineKind::Sglang, SGLANG.as_bytes()).unwrap().preemptions, None);
    // Absent: not exported. Each engine reads only its own name.
    assert_eq!(vllm(VLLM).unwrap().preemptions, None);
    assert_eq!(vllm(VLLM).unwrap().cache(TickRate::NANOS).preemptions, EngineCache::NO_COUNTER);
    let other = parse(EngineKind::Sglang, two.as_bytes()).unwrap();
    assert_eq!(other.preemptions, None);
    // A malformed or negative sample fails the scrape, like every summed family's.
    let bad = "vllm:num_preemptions_total{engine=\"0\"} -1\n";
    assert!(matches!(vllm(bad), Err(ScrapeError::BadValue { line: 1, .. })), "{:?}", vllm(bad));
    check_properties(two.as_bytes());
    check_properties(sglang.as_bytes());
}

#[test]
fn cache_rounds_and_saturates() {
    let gauges = EngineGauges {
        kv_capacity_tokens: Some(1e12),
        prefix_queries: Some(2.5),
        prefix_hits: Some(1e30),
        ..EngineGauges::default()
    };
    let cache = gauges.cache(TickRate::NANOS);
    assert_eq!(cache.kv_capacity_tokens, u32::MAX);
    assert_eq!(cache.prefix_queries, 3);
    assert_eq!(cache.prefix_hits, EngineCache::NO_COUNTER - 1);
    let gauges = EngineGauges { kv_capacity_tokens: Some(1600.4), ..EngineGauges::default() };
    assert_eq!(gauges.cache(TickRate::NANOS).kv_capacity_tokens, 1600);
    assert_eq!(gauges.cache(TickRate::NANOS).prefix_hits, EngineCache::NO_COUNTER);
    assert_eq!(gauges.cache(TickRate::NANOS).kv_usage_micro, EngineCache::NO_USAGE);
    // A usage over one (an engine rounding, or a sum of several) is one whole.
    for (usage, micro) in [(0.123_456_7, 123_457), (1.0, 1_000_000), (1.7, 1_000_000)] {
        let gauges = EngineGauges { cache_usage: Some(usage), ..EngineGauges::default() };
        assert_eq!(gauges.cache(TickRate::NANOS).kv_usage_micro, micro, "{usage}");
    }
}

#[test]
fn sum_families_sums_any_family_under_the_same_rules() {
    const BUSY: &str = "warmpath_sim_busy_seconds_total";
    const TIME: &str = "warmpath_sim_time_seconds_total";
    let text = format!(
        "{BUSY}{{model_name=\"a\"}} 1.5\n{BUSY}{{model_name=\"b\"}} 2\n{BUSY}_created 9\n{WAITING} 4\n"
    );
    let mut sums = [Some(7.0); 2];
    let limits = ScrapeLimits::default();
    assert_eq!(sum_families(text.as_bytes(), &[BUSY, TIME], &limits, &mut sums), Ok(()));
    assert_eq!(sums, [Some(3.5), None]);
    let bad = format!("{text}{TIME} NaN\n");
    let error = ScrapeError::BadValue { line: 5, family: TIME };
    assert_eq!(sum_families(bad.as_bytes(), &[BUSY, TIME], &limits, &mut sums), Err(error));
    let limits = ScrapeLimits { body_bytes_max: 4, ..limits };
    let refused = sum_families(text.as_bytes(), &[BUSY, TIME], &limits, &mut sums);
    assert!(matches!(refused, Err(ScrapeError::BodyTooLarge { .. })));
    assert_eq!(sums, [None, None]);
}

#[test]
fn the_inter_token_histograms_sum_and_count_are_summed_over_engines_and_put_in_ticks() {
    let histogram = |name: &str, engine: u32, sum: f64, count: f64| {
        format!(
            "{name}_bucket{{engine=\"{engine}\",le=\"0.01\",model_name=\"m\"}} 1.0\n\
             {name}_count{{engine=\"{engine}\",model_name=\"m\"}} {count}\n\
             {name}_sum{{engine=\"{engine}\",model_name=\"m\"}} {sum}\n"
        )
    };
    let new = "vllm:inter_token_latency_seconds";
    let old = "vllm:time_per_output_token_seconds";
    let two = histogram(new, 0, 1.5, 100.0) + &histogram(new, 1, 0.5, 60.0);
    assert_eq!(vllm(&two).unwrap().itl, Some((2.0, 160.0)));
    // Two ticks a nanosecond: the sum in ticks; the count as it is.
    let cache = vllm(&two).unwrap().cache(TickRate::new(2.0));
    assert_eq!((cache.itl_ticks, cache.itl_count), (4_000_000_000, 160));
    // vLLM's older name is read only when the newer is absent, and both halves come from one.
    let both = histogram(old, 0, 9.0, 900.0) + &two;
    assert_eq!(vllm(&both).unwrap().itl, Some((2.0, 160.0)));
    assert_eq!(vllm(&histogram(old, 0, 9.0, 900.0)).unwrap().itl, Some((9.0, 900.0)));
    let mixed = format!("{new}_sum 1.0\n{old}_count 5\n");
    assert_eq!(vllm(&mixed).unwrap().itl, None, "a sum without its count");
    // Absent: not exported.
    assert_eq!(vllm(VLLM).unwrap().itl, None);
    let cache = vllm(VLLM).unwrap().cache(TickRate::NANOS);
    assert_eq!(
        (cache.itl_ticks, cache.itl_count),
        (EngineCache::NO_COUNTER, EngineCache::NO_COUNTER)
    );
    // SGLang's histogram under its own name; each engine reads only its own.
    let sglang = histogram("sglang:inter_token_latency_seconds", 0, 0.25, 10.0);
    assert_eq!(parse(EngineKind::Sglang, sglang.as_bytes()).unwrap().itl, Some((0.25, 10.0)));
    assert_eq!(vllm(&sglang).unwrap().itl, None);
    // A malformed sample fails the scrape, like every summed family's.
    let bad = format!("{new}_count{{engine=\"0\"}} x\n");
    assert!(matches!(vllm(&bad), Err(ScrapeError::Malformed { line: 1, .. })));
    check_properties(two.as_bytes());
    check_properties(both.as_bytes());
}
