//! `GET /status` on the admin listener (issue \[10\], SPEC 10): one self-contained HTML page in
//! the manner of HAProxy's stats page. Per model: the lanes' depths and admissions, inflight,
//! tracked sessions, the oldest wait, two sparklines (queue depth and admissions per second,
//! drawn by the page's script from its polls) and the oldest waiting requests; per backend:
//! health and ejection, inflight, the admission gates' states and the learned estimates of
//! issue \[8\] with their ages.
//!
//! The server renders the whole first paint from the same documents `/debug/queue` and
//! `/debug/backends` serve ([`queue_json`], [`backends_json`]), so the page works
//! without JavaScript (a `<noscript>` refresh reloads it every 10 s) and its numbers are the
//! endpoints' numbers. The script (`status.js`) then polls those two endpoints every 2 s and
//! rewrites each cell, which names its value's JSON pointer (`data-p`) and format (`data-f`,
//! [`Format`]). The style is `status.css`. Nothing is loaded from anywhere else.
//!
//! Rendering is bounded: the documents list at most
//! [`OLDEST_WAITING_MAX`](super::report::OLDEST_WAITING_MAX) waiting requests per model with
//! the totals, so the page costs the same with ten thousand requests queued as with none;
//! its size grows only with the configured models and backends. One `String`, built by
//! `write!`; every string from the configuration (model names, backend addresses) or from a
//! request is HTML-escaped.

use std::fmt::Write as _;

use serde_json::Value;

use crate::clock::{Tick, TickRate};
use crate::scheduler::Lane;

use super::admin::{backends_json, queue_json};
use super::exposition::reports;
use super::generation::Generation;
use super::report::Report;
use super::Shared;

/// The page's style sheet, inlined in a `<style>` element.
const STYLE: &str = include_str!("status.css");
/// The page's script, inlined in a `<script>` element.
const SCRIPT: &str = include_str!("status.js");
/// The base64 SHA-256 digests of [`STYLE`] and [`SCRIPT`], as the Content-Security-Policy
/// names them (a unit test recomputes both and fails, printing the new values, when a file
/// changes).
const STYLE_SHA256: &str = "iPCoO2lqgVYQBAqOLmeFSM0GnVHV0Grr3WobeTNgrCM=";
const SCRIPT_SHA256: &str = "3zzB+vgQE0izp++4gApSPa2HzUn70TZE9BorcPH0vWc=";

/// The `Content-Security-Policy` of the page. Nothing may load but the page itself and the two
/// JSON endpoints its script polls (`connect-src 'self'`); the inline style and script run
/// because their digests are listed. Digests rather than a per-response nonce: both are
/// constant, so nothing random is needed per response, and a digest admits exactly the
/// shipped text, where a nonce admits any script that carries it; the page contains no other
/// script or style element and no `style` or event-handler attribute, which the digests would
/// not cover.
pub fn content_security_policy() -> String {
    format!(
        "default-src 'none'; script-src 'sha256-{SCRIPT_SHA256}'; \
         style-src 'sha256-{STYLE_SHA256}'; connect-src 'self'; img-src 'none'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
}

/// `GET /status`: the page for the active generation, now.
pub fn render(shared: &Shared) -> String {
    let generation = shared.generation();
    let reports = reports(&generation);
    render_generation(&generation, &reports, shared.clock.now(), shared.clock.rate())
}

/// The page for `generation` with its models' `reports` (in model order) at `now`.
pub fn render_generation(
    generation: &Generation,
    reports: &[Report],
    now: Tick,
    rate: TickRate,
) -> String {
    let queue = queue_json(generation, reports, now, rate);
    let backends = backends_json(generation, reports, now, rate);
    page(generation.number, &queue, &backends)
}

/// How a cell shows its value; the same names and rules as `format` in `status.js`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// A string as it is, or a number or boolean as JSON writes it.
    Text,
    /// A number as JSON writes it.
    Int,
    /// Milliseconds: `12 ms` below a second, else `1.5 s`.
    Ms,
    /// A ratio as a percentage with one decimal.
    Pct,
    /// A rate, rounded to a whole number.
    Rate,
    /// `yes` or `no`.
    Bool,
    /// A backend's state from its whole row: `removed`, `ejected`, `up` or `down`.
    State,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Int => "int",
            Format::Ms => "ms",
            Format::Pct => "pct",
            Format::Rate => "rate",
            Format::Bool => "bool",
            Format::State => "state",
        }
    }
}

/// A table column: its heading, the JSON pointer of its value within a row, its format.
#[derive(Debug)]
struct Column {
    head: &'static str,
    pointer: &'static str,
    format: Format,
}

const fn column(head: &'static str, pointer: &'static str, format: Format) -> Column {
    Column { head, pointer, format }
}

/// The backends table, one row per entry of `/debug/backends`.
const BACKEND_COLUMNS: [Column; 22] = [
    column("model", "/model", Format::Text),
    column("backend", "/backend", Format::Text),
    column("state", "", Format::State),
    column("inflight", "/inflight", Format::Int),
    column("held slots", "/held_slots", Format::Int),
    column("prefill backlog (tokens)", "/prefill_tokens", Format::Int),
    column("gate: slots", "/gates/slots", Format::Text),
    column("gate: engine waiting", "/gates/engine_waiting", Format::Text),
    column("gate: prefill budget", "/gates/prefill_budget", Format::Text),
    column("engine waiting", "/waiting", Format::Int),
    column("scraped", "/last_scrape_age_ms", Format::Ms),
    column("prefill tokens/s", "/learned/prefill_tokens_per_second", Format::Rate),
    column("age", "/learned/prefill_rate_age_ms", Format::Ms),
    column("admission budget (tokens)", "/learned/admission_budget_tokens", Format::Int),
    column("age", "/learned/admission_budget_age_ms", Format::Ms),
    column("KV capacity (tokens)", "/learned/kv_capacity_tokens", Format::Int),
    column("age", "/learned/kv_capacity_age_ms", Format::Ms),
    column("prefix index (blocks)", "/learned/prefix_index_capacity_blocks", Format::Int),
    column("hit ratio: predicted", "/learned/prefix_hit_ratio_predicted", Format::Pct),
    column("hit ratio: engine", "/learned/prefix_hit_ratio_engine", Format::Pct),
    column("age", "/learned/prefix_hit_ratio_age_ms", Format::Ms),
    column("engine restarts", "/learned/engine_restarts", Format::Int),
];

/// A model's oldest waiting requests, one row per entry of its `oldest_waiting`.
const WAITING_COLUMNS: [Column; 5] = [
    column("request", "/id", Format::Text),
    column("lane", "/lane", Format::Text),
    column("waiting", "/wait_ms", Format::Ms),
    column("session", "/session", Format::Bool),
    column("retries", "/retries", Format::Int),
];

/// A model's summary figures, each from its entry of `/debug/queue`.
const MODEL_FIGURES: [Column; 4] = [
    column("queued", "/queued", Format::Int),
    column("inflight", "/inflight", Format::Int),
    column("sessions tracked", "/sessions_tracked", Format::Int),
    column("oldest wait", "/oldest_wait_ms", Format::Ms),
];

/// The whole page from the two documents.
fn page(generation: u64, queue: &Value, backends: &Value) -> String {
    let mut out = String::with_capacity(64 << 10);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>\n\
         <title>warmpath status</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<header>\
         <h1>warmpath</h1><span class=\"muted\">generation {generation}</span>\
         <span id=\"live\" data-v=\"static\">as of this page load</span></header>\n"
    );
    out.push_str("<main>\n<h2>Models</h2>\n<div class=\"models\">\n");
    let empty = Vec::new();
    let models = queue.get("models").and_then(Value::as_array).unwrap_or(&empty);
    for (index, model) in models.iter().enumerate() {
        model_card(&mut out, index, model);
    }
    out.push_str("</div>\n<h2>Backends</h2>\n<div class=\"scroll\" id=\"backends-wrap\">");
    let rows = backends.get("backends").and_then(Value::as_array).unwrap_or(&empty);
    table(&mut out, "id=\"backends\"", "", &BACKEND_COLUMNS, rows);
    let _ = write!(
        out,
        "</div>\n<p class=\"muted\">The same numbers as JSON: <a href=\"/debug/queue\">/debug/queue</a>, \
         <a href=\"/debug/backends\">/debug/backends</a>, <a href=\"/debug/config\">/debug/config</a>, \
         <a href=\"/metrics\">/metrics</a>.</p>\n</main>\n<script>{SCRIPT}</script>\n</body>\n</html>\n"
    );
    out
}

/// One model's card: summary, lanes, sparklines, oldest waiting requests.
fn model_card(out: &mut String, index: usize, model: &Value) {
    let name = model.get("model").and_then(Value::as_str).unwrap_or("");
    out.push_str("<section class=\"model\" id=\"model-");
    let _ = write!(out, "{index}\" data-model=\"");
    escape(out, name);
    out.push_str("\">\n<h3>");
    escape(out, name);
    if model.get("live") == Some(&Value::Bool(false)) {
        out.push_str(" <span data-v=\"removed\">(removed)</span>");
    }
    out.push_str("</h3>\n<p class=\"muted\">");
    limits(out, model.get("limits").unwrap_or(&Value::Null));
    out.push_str("</p>\n<dl>");
    for figure in &MODEL_FIGURES {
        let _ = write!(out, "<div><dt>{}</dt>", figure.head);
        cell(out, "dd", figure, model);
        out.push_str("</div>");
    }
    out.push_str(
        "</dl>\n<div class=\"scroll\"><table class=\"lanes\"><thead><tr><th>lane</th>\
         <th>queued</th><th>admitted</th></tr></thead><tbody>",
    );
    for lane in Lane::ALL {
        let name = lane.name();
        let _ = write!(out, "<tr><td>{name}</td>");
        for (kind, pointer) in [("depth", "/depth/"), ("admitted", "/admitted/")] {
            let value = model.get(kind).and_then(|v| v.get(name)).unwrap_or(&Value::Null);
            let _ = write!(out, "<td data-p=\"{pointer}{name}\" data-f=\"int\"");
            value_attr_and_text(out, value, Format::Int, "td");
        }
        out.push_str("</tr>");
    }
    out.push_str(
        "</tbody></table></div>\n\
         <svg class=\"spark\" viewBox=\"0 0 300 60\" role=\"img\" aria-label=\"queued\"></svg>\n\
         <svg class=\"spark\" viewBox=\"0 0 300 60\" role=\"img\" aria-label=\"admitted per second\"></svg>\n\
         <noscript><p class=\"muted\">The charts are drawn from the page's polls and need \
         JavaScript.</p></noscript>\n<div class=\"scroll\">",
    );
    let mut caption = String::from("<caption>Oldest waiting requests: at most ");
    let max = model.get("oldest_waiting_max").unwrap_or(&Value::Null);
    let _ = write!(caption, "{max} listed, of <span data-p=\"/queued\" data-f=\"int\"");
    value_attr_and_text(
        &mut caption,
        model.get("queued").unwrap_or(&Value::Null),
        Format::Int,
        "span",
    );
    caption.push_str(" queued</caption>");
    let empty = Vec::new();
    let waiting = model.get("oldest_waiting").and_then(Value::as_array).unwrap_or(&empty);
    table(out, "class=\"waiting\"", &caption, &WAITING_COLUMNS, waiting);
    out.push_str("</div>\n</section>\n");
}

/// A model's queue limits in one line.
fn limits(out: &mut String, limits: &Value) {
    let mut first = true;
    for key in ["strategy", "max_queued", "inflight_per_backend", "timeout_ms"] {
        let Some(value) = limits.get(key) else { continue };
        if !first {
            out.push_str(" · ");
        }
        first = false;
        escape(out, key);
        out.push(' ');
        text(out, value, Format::Text);
    }
}

/// A table with a heading per column (naming its pointer and format, which the script reads
/// to rebuild the body) and a row per entry of `rows`.
fn table(out: &mut String, attributes: &str, caption: &str, columns: &[Column], rows: &[Value]) {
    let _ = write!(out, "<table {attributes}>{caption}<thead><tr>");
    for column in columns {
        let class = if column.format == Format::Text { " class=\"text\"" } else { "" };
        let _ = write!(
            out,
            "<th{class} data-p=\"{}\" data-f=\"{}\">{}</th>",
            column.pointer,
            column.format.name(),
            column.head
        );
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for column in columns {
            cell(out, "td", column, row);
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

/// `<tag data-p data-f data-v>value</tag>` for `column` of `row`.
fn cell(out: &mut String, tag: &str, column: &Column, row: &Value) {
    let value = if column.pointer.is_empty() { Some(row) } else { row.pointer(column.pointer) };
    let class = if column.format == Format::Text { " class=\"text\"" } else { "" };
    let _ = write!(
        out,
        "<{tag}{class} data-p=\"{}\" data-f=\"{}\"",
        column.pointer,
        column.format.name()
    );
    value_attr_and_text(out, value.unwrap_or(&Value::Null), column.format, tag);
}

/// ` data-v="TEXT">TEXT</tag>`: the rest of an opened element holding `value`.
fn value_attr_and_text(out: &mut String, value: &Value, format: Format, tag: &str) {
    let start = out.len();
    text(out, value, format);
    let shown = out.split_off(start);
    let _ = write!(out, " data-v=\"{shown}\">{shown}</{tag}>");
}

/// `value` shown in `format`, HTML-escaped; `–` for null.
fn text(out: &mut String, value: &Value, format: Format) {
    if format == Format::State {
        let flag = |key: &str| value.get(key).and_then(Value::as_bool).unwrap_or(false);
        let state = match () {
            () if !flag("live") => "removed",
            () if flag("ejected") => "ejected",
            () if flag("healthy") => "up",
            () => "down",
        };
        out.push_str(state);
        return;
    }
    let number = value.as_f64();
    match (format, value, number) {
        (_, Value::Null, _) => out.push('\u{2013}'),
        (Format::Ms, _, Some(ms)) if ms < 1000.0 => _ = write!(out, "{ms:.0} ms"),
        (Format::Ms, _, Some(ms)) => _ = write!(out, "{:.1} s", ms / 1000.0),
        (Format::Pct, _, Some(ratio)) => _ = write!(out, "{:.1} %", ratio * 100.0),
        (Format::Rate, _, Some(rate)) => _ = write!(out, "{rate:.0}"),
        (Format::Bool, Value::Bool(flag), _) => out.push_str(if *flag { "yes" } else { "no" }),
        (_, Value::String(string), _) => escape(out, string),
        (_, other, _) => escape(out, &other.to_string()),
    }
}

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by character references: safe in element
/// content and in double- or single-quoted attribute values.
fn escape(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Standard base64 with padding, as CSP hash sources are written.
    fn base64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n =
                chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
            for i in 0..4 {
                let c = if i <= chunk.len() {
                    ALPHABET[(n >> (18 - 6 * i) & 63) as usize]
                } else {
                    b'='
                };
                out.push(char::from(c));
            }
        }
        out
    }

    #[test]
    fn the_policy_names_the_digests_of_the_inline_style_and_script() {
        use sha2::{Digest, Sha256};
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        let style = base64(&Sha256::digest(STYLE.as_bytes()));
        let script = base64(&Sha256::digest(SCRIPT.as_bytes()));
        assert_eq!((STYLE_SHA256, SCRIPT_SHA256), (style.as_str(), script.as_str()));
    }

    #[test]
    fn strings_are_escaped() {
        let mut out = String::new();
        escape(&mut out, "<a href='x'>\"&\"</a>");
        assert_eq!(out, "&lt;a href=&#39;x&#39;&gt;&quot;&amp;&quot;&lt;/a&gt;");
    }

    #[test]
    fn formats_match_the_script() {
        let shown = |value: Value, format: Format| {
            let mut out = String::new();
            text(&mut out, &value, format);
            out
        };
        assert_eq!(shown(Value::Null, Format::Ms), "\u{2013}");
        assert_eq!(shown(12.4.into(), Format::Ms), "12 ms");
        assert_eq!(shown(1530.0.into(), Format::Ms), "1.5 s");
        assert_eq!(shown(0.4567.into(), Format::Pct), "45.7 %");
        assert_eq!(shown(1234.6.into(), Format::Rate), "1235");
        assert_eq!(shown(true.into(), Format::Bool), "yes");
        assert_eq!(shown(17.into(), Format::Int), "17");
        assert_eq!(shown("<b>".into(), Format::Text), "&lt;b&gt;");
        let row = serde_json::json!({"live": true, "ejected": false, "healthy": true});
        assert_eq!(shown(row, Format::State), "up");
    }

    #[test]
    fn the_page_escapes_names_and_shows_every_model_and_backend() {
        let queue = serde_json::json!({"models": [{
            "model": "<m&'\">", "live": true, "queued": 3, "inflight": 1,
            "sessions_tracked": 2, "oldest_wait_ms": 5.0,
            "depth": {"retry": 0, "forced": 0, "boosted": 1, "normal": 2},
            "admitted": {"retry": 0, "forced": 0, "boosted": 4, "normal": 5},
            "oldest_waiting": [{"id": "wp-1", "lane": "normal", "wait_ms": 5.0,
                                "session": false, "retries": 0}],
            "oldest_waiting_max": 10, "limits": {"strategy": "session-boost"},
        }]});
        let backends = serde_json::json!({"backends": [{
            "model": "<m&'\">", "backend": "10.0.0.1:8000", "live": true, "healthy": true,
            "ejected": false, "inflight": 1, "learned": {},
        }]});
        let html = page(1, &queue, &backends);
        assert!(!html.contains("<m&"), "unescaped model name");
        assert!(html.contains("&lt;m&amp;&#39;&quot;&gt;"));
        assert!(html.contains("10.0.0.1:8000"));
        assert!(html.contains("wp-1"));
        assert!(html.contains("<dd data-p=\"/queued\" data-f=\"int\" data-v=\"3\">3</dd>"));
    }
}
