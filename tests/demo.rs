//! `warmpath demo` end to end, shortened: two simulated engines and the router on loopback, a
//! small workload run with both strategies, and the report it writes.

use std::time::Duration;

use warmpath::demo::{demo, DemoArgs};

#[test]
fn the_demo_runs_both_strategies_and_writes_its_report() {
    let out = std::env::temp_dir().join(format!("warmpath-demo-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let args = DemoArgs {
        duration: Duration::from_secs(2),
        rate: 3.0,
        turns: 2,
        context_words: 200,
        time_scale: 4.0,
        out: out.clone(),
        routing: "prefix-cost".into(),
        seed: 3,
        no_progress: true,
    };
    let dir = demo(&args).expect("the demo runs");
    assert_eq!(dir, out);
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains("fifo") && report.contains("session-boost"), "{report}");
    assert!(report.contains("ttft.svg"), "the report links its plot");
    let svg = std::fs::read_to_string(out.join("ttft.svg")).expect("the plot");
    assert!(svg.starts_with("<svg") || svg.contains("<svg"), "an SVG");
    assert!(report.contains("fifo_least-inflight.json"), "the report names the raw data");
    for label in ["fifo_least-inflight", "session-boost_prefix-cost"] {
        let json = std::fs::read_to_string(out.join(format!("{label}.json"))).expect(label);
        let result: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let planned = result["planned"].as_u64().expect("planned");
        assert!(planned >= 2, "{label}: a workload with sessions ({planned} turns)");
        assert_eq!(result["all"]["ok"], result["all"]["requests"], "{label}: every turn succeeded");
        assert_eq!(result["all"]["requests"].as_u64(), Some(planned), "{label}: all sent");
        assert!(result["follow_ups"]["ok"].as_u64().unwrap() > 0, "{label}: follow-ups ran");
        let hit_rate = result["prefix_cache"]["hit_rate"].as_f64().expect("a hit rate");
        assert!(hit_rate > 0.0, "{label}: follow-ups hit the engines' prefix caches");
    }
    let _ = std::fs::remove_dir_all(&out);
}
