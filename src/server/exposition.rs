//! `GET /metrics`: the Prometheus text exposition (SPEC 6 and section 10). Every family is a row
//! of [`FAMILIES`]: its name, type, help, and the [`Source`] of its series. [`render`] walks the
//! table once; what a source means (which labels, summed over which shards) is written once per
//! kind of source, not once per family.
//!
//! Shard counters are summed over shards at scrape time (SPEC 6: never a shared contended
//! cache line); scheduler counters and gauges come from each scheduler's published
//! [`Report`].
//!
//! Issue \[11\]'s `tenant` label: `warmpath_requests_total`, `warmpath_admitted_total` and
//! `warmpath_ttft_seconds` carry it on the series of requests from a configured tenant, one
//! series per tenant that has sent the model a request (histograms: per bucket set that has an
//! observation). Requests without a tenant keep the series they always had, without the label,
//! so a router with no `[[tenant]]` exposes exactly what it did before.

use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::scheduler::estimate::BackendEstimates;
use crate::scheduler::Lane;

use crate::scheduler::tracker::TURN_BUCKETS;

use super::metrics::{
    Histogram, ModelMetrics, ShardMetrics, TenantMetrics, UpstreamError, PREFIX_LABELS,
    STATUS_SLOTS,
};
use super::report::{BackendReport, Report};
use super::{Generation, Shared};

/// The scrape: every family of [`FAMILIES`], in order.
pub fn render(shared: &Shared) -> String {
    let generation = shared.generation();
    let scrape = Scrape::new(shared, &generation);
    let mut out = String::with_capacity(16 << 10);
    for family in FAMILIES {
        let (name, kind, help) = (family.name, family.kind, family.help);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        scrape.series(&mut out, name, &family.source);
    }
    out
}

/// One metric family.
#[derive(Debug)]
struct Family {
    name: &'static str,
    /// The `# TYPE`: `counter`, `gauge` or `histogram`.
    kind: &'static str,
    help: &'static str,
    source: Source,
}

type Labelled = fn(&Report) -> [(&'static str, u64); 3];

/// Where a family's series come from, and so which labels they carry.
#[derive(Debug)]
enum Source {
    /// `model`, `status`, `tenant`: responses counted by the shards (statuses never seen are
    /// left out; `tenant` only on a configured tenant's).
    Statuses,
    /// `model`, `lane`, `tenant`: admissions. Without any tenant configured, from the
    /// scheduler's report; with, counted by the shards that received them.
    Admitted,
    /// `status`: the router's answers before a model was known.
    RouterStatuses,
    /// `model`: a histogram of the shards.
    Histogram(fn(&ModelMetrics) -> &Histogram),
    /// `model`, `lane`: a histogram of the shards per lane.
    LaneHistogram(fn(&ModelMetrics, Lane) -> &Histogram),
    /// `model`, `turn`, `prefix`, `tenant`: time to first byte by turn bucket and predicted
    /// prefix (issue \[10\]; `tenant` as for `Statuses`).
    TurnPrefixHistogram,
    /// `model`, `turn`: a histogram of the shards per turn bucket (issue \[10\]).
    TurnHistogram(fn(&ModelMetrics, usize) -> &Histogram),
    /// `model`: a counter of the shards.
    ModelCounter(fn(&ModelMetrics) -> &AtomicU64),
    /// `model`, `lane`: from the scheduler's report.
    Lane(fn(&Report, Lane) -> u64),
    /// `model`: from the scheduler's report.
    Model(fn(&Report) -> u64),
    /// `model` and the given label: from the scheduler's report, one series per value.
    ModelLabelled(&'static str, Labelled),
    /// `model`: the share of a prompt's blocks matched at admission, in tenths (S16).
    MatchRatio,
    /// `model`: the learned tokens per byte of request body.
    TokensPerByte,
    /// `model`, `backend`: from the scheduler's report.
    Backend(fn(&BackendReport) -> u64),
    /// `model`, `backend`: a learned estimate (given ticks per second), left out while unknown.
    Learned(fn(&BackendEstimates, f64) -> Option<f64>),
    /// `model`, `backend`, `source`: the predicted and the engine-reported hit ratio.
    HitRatio,
    /// `model`, `backend`, `kind`: the shards' upstream failures.
    UpstreamErrors,
    /// `model`, `backend`: a per-backend counter of the shards.
    BackendCounter(fn(&ModelMetrics) -> &[AtomicU64]),
    /// `tenant` and the given label: a per-tenant pair of counters of the shards (issue
    /// \[11\]), one series per configured tenant and label value.
    Tenant(&'static str, [&'static str; 2], fn(&ShardMetrics) -> &[[AtomicU64; 2]]),
    /// No labels: summed over the shards.
    Shards(fn(&ShardMetrics) -> &AtomicU64),
    /// No labels: the router's own.
    Router(fn(&Shared, &Generation) -> u64),
}

#[cfg(test)]
impl Source {
    /// The labels of the family's series, in order (docs/metrics.md lists them so).
    fn labels(&self) -> Vec<&'static str> {
        let labels: &[&str] = match *self {
            Source::Statuses => &["model", "status", "tenant"],
            Source::Admitted => &["model", "lane", "tenant"],
            Source::RouterStatuses => &["status"],
            Source::LaneHistogram(_) | Source::Lane(_) => &["model", "lane"],
            Source::TurnPrefixHistogram => &["model", "turn", "prefix", "tenant"],
            Source::TurnHistogram(_) => &["model", "turn"],
            Source::Histogram(_)
            | Source::ModelCounter(_)
            | Source::Model(_)
            | Source::MatchRatio
            | Source::TokensPerByte => &["model"],
            Source::ModelLabelled(key, _) => return vec!["model", key],
            Source::Backend(_) | Source::Learned(_) | Source::BackendCounter(_) => {
                &["model", "backend"]
            }
            Source::HitRatio => &["model", "backend", "source"],
            Source::UpstreamErrors => &["model", "backend", "kind"],
            Source::Tenant(key, _, _) => return vec!["tenant", key],
            Source::Shards(_) | Source::Router(_) => &[],
        };
        labels.to_vec()
    }
}

/// Every family `/metrics` exposes, in the order it exposes them (docs/metrics.md).
static FAMILIES: &[Family] = &[
    Family {
        name: "warmpath_requests_total",
        kind: "counter",
        help: "Responses by model and status.",
        source: Source::Statuses,
    },
    Family {
        name: "warmpath_router_responses_total",
        kind: "counter",
        help: "Router answers before a model was known, by status.",
        source: Source::RouterStatuses,
    },
    Family {
        name: "warmpath_request_duration_seconds",
        kind: "histogram",
        help: "Arrival to last byte.",
        source: Source::Histogram(|m| &m.duration),
    },
    Family {
        name: "warmpath_upstream_ttfb_seconds",
        kind: "histogram",
        help: "Forwarded to first response byte.",
        source: Source::Histogram(|m| &m.ttfb),
    },
    Family {
        name: "warmpath_queue_wait_seconds",
        kind: "histogram",
        help: "Arrival to admission, by lane.",
        source: Source::LaneHistogram(|m, lane| &m.queue_wait[lane as usize]),
    },
    Family {
        name: "warmpath_ttft_seconds",
        kind: "histogram",
        help: "Arrival to first response byte, by turn depth and prefix predicted at admission.",
        source: Source::TurnPrefixHistogram,
    },
    Family {
        name: "warmpath_queue_wait_by_turn_seconds",
        kind: "histogram",
        help: "Arrival to admission, by turn depth.",
        source: Source::TurnHistogram(|m, turn| &m.queue_wait_by_turn[turn]),
    },
    Family {
        name: "warmpath_queue_depth",
        kind: "gauge",
        help: "Queued requests by lane.",
        source: Source::Lane(|r, lane| u64::from(r.depth[lane as usize])),
    },
    Family {
        name: "warmpath_admitted_total",
        kind: "counter",
        help: "Admissions by lane.",
        source: Source::Admitted,
    },
    Family {
        name: "warmpath_forced_total",
        kind: "counter",
        help: "Boosted requests forced by bounded overtaking (S4).",
        source: Source::Model(|r| r.stats.forced),
    },
    Family {
        name: "warmpath_queue_timeouts_total",
        kind: "counter",
        help: "Requests that waited past queue.timeout.",
        source: Source::Model(|r| r.stats.timeouts),
    },
    Family {
        name: "warmpath_queue_cancelled_total",
        kind: "counter",
        help: "Requests whose client left while queued.",
        source: Source::Model(|r| r.stats.cancelled),
    },
    Family {
        name: "warmpath_grace_holds_total",
        kind: "counter",
        help: "Slots held for a session's follow-up (S8).",
        source: Source::Model(|r| r.stats.grace_holds),
    },
    Family {
        name: "warmpath_grace_hits_total",
        kind: "counter",
        help: "Follow-ups admitted into a held slot.",
        source: Source::Model(|r| r.stats.grace_hits),
    },
    Family {
        name: "warmpath_sessions_tracked",
        kind: "gauge",
        help: "Recently completed sessions remembered.",
        source: Source::Model(|r| r.sessions_tracked as u64),
    },
    Family {
        name: "warmpath_sessions_active",
        kind: "gauge",
        help: "Sessions with a request queued or in flight.",
        source: Source::Model(|r| u64::from(r.sessions_active)),
    },
    Family {
        name: "warmpath_affinity_hits_total",
        kind: "counter",
        help: "Admissions to the session's last backend.",
        source: Source::Model(|r| r.stats.affinity_hits),
    },
    Family {
        name: "warmpath_retries_total",
        kind: "counter",
        help: "Requests sent back for another backend.",
        source: Source::Model(|r| r.stats.retries),
    },
    Family {
        name: "warmpath_boost_declined_total",
        kind: "counter",
        help: "Follow-ups not boosted: their prompt repeats less than half the previous \
               turn's (S16), or that turn's engine restarted since.",
        source: Source::Model(|r| r.stats.boost_declined),
    },
    Family {
        name: "warmpath_placement_waits_total",
        kind: "counter",
        help: "Requests that waited for their cheapest backend (S16).",
        source: Source::Model(|r| r.stats.placement_waits),
    },
    Family {
        name: "warmpath_prefix_copies_total",
        kind: "counter",
        help: "First turns sent to copy a hot shared prefix to another backend (S16).",
        source: Source::Model(|r| r.stats.prefix_copies),
    },
    Family {
        name: "warmpath_ejections_total",
        kind: "counter",
        help: "Backends passively ejected.",
        source: Source::Model(|r| r.stats.ejections),
    },
    Family {
        name: "warmpath_model_inflight",
        kind: "gauge",
        help: "Admitted requests not yet released.",
        source: Source::Model(|r| u64::from(r.inflight)),
    },
    Family {
        name: "warmpath_prefix_match_ratio",
        kind: "histogram",
        help: "Share of a prompt's blocks cached on the chosen backend at admission (S16).",
        source: Source::MatchRatio,
    },
    Family {
        name: "warmpath_queue_rejected_total",
        kind: "counter",
        help: "Requests refused by the queue, by reason.",
        source: Source::ModelLabelled("reason", |r| {
            [
                ("queue_full", r.stats.rejected_full),
                ("shutting_down", r.stats.rejected_shutdown),
                ("retries_exhausted", r.stats.retries_exhausted),
            ]
        }),
    },
    Family {
        name: "warmpath_inflight",
        kind: "gauge",
        help: "Admitted requests on the backend.",
        source: Source::Backend(|b| u64::from(b.inflight)),
    },
    Family {
        name: "warmpath_prefill_backlog_tokens",
        kind: "gauge",
        help: "Estimated prompt tokens awaiting a first byte (S6.3).",
        source: Source::Backend(|b| b.prefill_tokens),
    },
    Family {
        name: "warmpath_backend_up",
        kind: "gauge",
        help: "1 when configured, healthy and not ejected.",
        source: Source::Backend(|b| u64::from(b.healthy && !b.ejected && !b.removed)),
    },
    Family {
        name: "warmpath_backend_waiting",
        kind: "gauge",
        help: "The engine's last scraped waiting-queue gauge.",
        source: Source::Backend(|b| u64::from(b.waiting.unwrap_or(0))),
    },
    Family {
        name: "warmpath_prefix_index_blocks",
        kind: "gauge",
        help: "Prompt blocks in the backend's prefix index (S16; 0 for other routings).",
        source: Source::Backend(|b| b.index_blocks),
    },
    Family {
        name: "warmpath_backend_prefill_tokens_per_second",
        kind: "gauge",
        help: "Learned prefill rate: estimated prompt tokens the engine clears per second \
               while it has the next request waiting.",
        source: Source::Learned(|e, ticks_per_second| {
            (e.rate.0 > 0).then(|| e.rate.0 as f64 / e.rate.1 as f64 * ticks_per_second)
        }),
    },
    Family {
        name: "warmpath_backend_admission_budget_tokens",
        kind: "gauge",
        help: "The prefill budget in force (S6.3; learned under auto): estimated uncached \
               prompt tokens awaiting a first byte the backend may have; 0 = none.",
        source: Source::Learned(|e, _| Some(e.budget as f64)),
    },
    Family {
        name: "warmpath_backend_kv_capacity_tokens",
        kind: "gauge",
        help: "KV-cache capacity the engine exports, tokens.",
        source: Source::Learned(|e, _| {
            (e.kv_capacity_tokens > 0).then_some(e.kv_capacity_tokens as f64)
        }),
    },
    Family {
        name: "warmpath_backend_restarts_total",
        kind: "counter",
        help: "Restarts of the backend's engine: a prefix-cache counter that went down, or its \
               host name moved to another engine; each empties the backend's prefix index.",
        source: Source::Learned(|e, _| Some(e.restarts as f64)),
    },
    Family {
        name: "warmpath_backend_prefix_hit_ratio",
        kind: "gauge",
        help: "Share of prompt tokens found cached: predicted by the prefix index, and \
               reported by the engine, over the last calibration period (engine: else over the \
               last scrape interval, from its counters).",
        source: Source::HitRatio,
    },
    Family {
        name: "warmpath_tokens_per_byte",
        kind: "gauge",
        help: "Learned prompt tokens per byte of request body (from responses' \
               usage.prompt_tokens).",
        source: Source::TokensPerByte,
    },
    Family {
        name: "warmpath_upstream_errors_total",
        kind: "counter",
        help: "Upstream failures by kind.",
        source: Source::UpstreamErrors,
    },
    Family {
        name: "warmpath_backend_key_refused_total",
        kind: "counter",
        help: "401 answers of the backend to the model's engine key (backend_api_key_file).",
        source: Source::BackendCounter(|m| &m.key_refused),
    },
    Family {
        name: "warmpath_pool_reconnects_total",
        kind: "counter",
        help: "Dead pooled connections replaced by a fresh one.",
        source: Source::ModelCounter(|m| &m.pool_reconnects),
    },
    Family {
        name: "warmpath_prompt_pool_exhausted_total",
        kind: "counter",
        help: "Requests placed without their prompt's block hashes: the model's prompt pool \
               had no free slot (S16).",
        source: Source::ModelCounter(|m| &m.prompt_pool_exhausted),
    },
    Family {
        name: "warmpath_tenant_tokens_total",
        kind: "counter",
        help: "Tokens of a tenant's 2xx responses as settled against its limits, by kind \
               (usage's prompt_tokens and completion_tokens, or their estimates).",
        source: Source::Tenant("kind", ["prompt", "completion"], |s| &s.tenant_tokens),
    },
    Family {
        name: "warmpath_rate_limited_total",
        kind: "counter",
        help: "Requests refused by their tenant's rate limits, by limit.",
        source: Source::Tenant("limit", ["requests", "tokens"], |s| &s.rate_limited),
    },
    Family {
        name: "warmpath_rate_limit_store_errors_total",
        kind: "counter",
        help: "Syncs with the Redis rate-limit store that failed (unreachable, refused, or \
               past its timeout); the limits were local meanwhile.",
        source: Source::Router(|shared, _| shared.limiter.store.errors.load(Ordering::Relaxed)),
    },
    Family {
        name: "warmpath_rate_limit_store_up",
        kind: "gauge",
        help: "1 when the last sync with the Redis rate-limit store succeeded; 0 when the \
               limits are local (the local store, or Redis away).",
        source: Source::Router(|shared, _| shared.limiter.store.up.load(Ordering::Relaxed)),
    },
    Family {
        name: "warmpath_connections_accepted_total",
        kind: "counter",
        help: "Client connections accepted.",
        source: Source::Shards(|s| &s.accepted),
    },
    Family {
        name: "warmpath_connections_refused_total",
        kind: "counter",
        help: "Client connections refused at max_connections.",
        source: Source::Shards(|s| &s.refused),
    },
    Family {
        name: "warmpath_accept_errors_total",
        kind: "counter",
        help: "accept() calls that failed (EMFILE: the open-file limit; ENFILE): connections \
               wait in the listen queue until a connection closes or 100 ms pass.",
        source: Source::Shards(|s| &s.accept_errors),
    },
    Family {
        name: "warmpath_upstream_socket_errors_total",
        kind: "counter",
        help: "Upstream connections the router could not open for want of its own descriptors \
               or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL): each request \
               answered 503, nothing counted against the backend.",
        source: Source::Shards(|s| &s.upstream_socket_errors),
    },
    Family {
        name: "warmpath_tls_errors_total",
        kind: "counter",
        help: "TLS connections closed on a TLS error: a failed handshake, bytes that are not \
               TLS, a record that does not decrypt.",
        source: Source::Shards(|s| &s.tls_errors),
    },
    Family {
        name: "warmpath_connections_open",
        kind: "gauge",
        help: "Open client connections.",
        source: Source::Shards(|s| &s.open),
    },
    Family {
        name: "warmpath_buffered_bytes",
        kind: "gauge",
        help: "Request bytes held while queued.",
        source: Source::Shards(|s| &s.buffered),
    },
    Family {
        name: "warmpath_clients_gone_total",
        kind: "counter",
        help: "Requests whose client left before the response ended.",
        source: Source::Shards(|s| &s.clients_gone),
    },
    Family {
        name: "warmpath_access_log_dropped_total",
        kind: "counter",
        help: "Access-log lines dropped because a shard's buffer was full or the sink failed.",
        source: Source::Router(|shared, _| shared.access_logs.iter().map(|l| l.dropped()).sum()),
    },
    Family {
        name: "warmpath_config_generation",
        kind: "gauge",
        help: "The active configuration generation.",
        source: Source::Router(|_, gen| gen.number),
    },
    Family {
        name: "warmpath_config_reloads_refused_total",
        kind: "counter",
        help: "Reloads refused (the file did not load or validate); the active generation \
               stayed.",
        source: Source::Router(|shared, _| shared.reloads_refused.load(Ordering::Relaxed)),
    },
];

/// What one scrape reads, taken once: the generation, the shards' counters, the schedulers'
/// reports, and the label values (escaped).
struct Scrape<'a> {
    shared: &'a Shared,
    gen: &'a Generation,
    shards: Vec<Arc<ShardMetrics>>,
    /// One per model of `gen`, in order.
    reports: Vec<Report>,
    /// `model` label values, by model index.
    models: Vec<String>,
    /// `backend` label values, by model and backend index.
    backends: Vec<Vec<String>>,
    /// `tenant` label values: tenant `t` at `t - 1`.
    tenants: Vec<String>,
    ticks_per_second: f64,
}

impl<'a> Scrape<'a> {
    fn new(shared: &'a Shared, gen: &'a Generation) -> Scrape<'a> {
        Scrape {
            shared,
            gen,
            shards: shared.shard_metrics(),
            reports: reports(gen),
            models: gen.models.iter().map(|m| label(&m.name)).collect(),
            backends: gen
                .models
                .iter()
                .map(|m| m.backends.iter().map(|b| label(&b.authority)).collect())
                .collect(),
            tenants: gen.tenants.iter().map(|t| label(&t.name)).collect(),
            ticks_per_second: shared.clock.rate().ticks_per_ns() * 1e9,
        }
    }

    /// Writes the series of family `name` from `source`.
    fn series(&self, out: &mut String, name: &str, source: &Source) {
        match *source {
            Source::Statuses => self.statuses(out, name),
            Source::Admitted => self.admitted(out, name),
            Source::RouterStatuses => {
                for status in 100..STATUS_SLOTS {
                    let n = self.sum_shards(|s| &s.other_status[status]);
                    if n > 0 {
                        put(out, name, &[("status", &status.to_string())], n);
                    }
                }
            }
            Source::Histogram(pick) => {
                for (model, m) in self.models.iter().enumerate() {
                    shard_histogram(out, name, &[("model", m)], self.of_model(model).map(pick));
                }
            }
            Source::LaneHistogram(pick) => self.lane_histograms(out, name, pick),
            Source::TurnPrefixHistogram => self.turn_histograms(out, name, None),
            Source::TurnHistogram(pick) => self.turn_histograms(out, name, Some(pick)),
            Source::ModelCounter(pick) => {
                for (model, m) in self.models.iter().enumerate() {
                    put(out, name, &[("model", m)], self.sum_model(model, pick));
                }
            }
            Source::Lane(pick) => self.per_lane(out, name, pick),
            Source::Model(pick) => {
                for (m, report) in self.models.iter().zip(&self.reports) {
                    put(out, name, &[("model", m)], pick(report));
                }
            }
            Source::ModelLabelled(key, pick) => {
                for (m, report) in self.models.iter().zip(&self.reports) {
                    for (value, n) in pick(report) {
                        put(out, name, &[("model", m), (key, value)], n);
                    }
                }
            }
            Source::MatchRatio => self.match_ratio(out, name),
            Source::TokensPerByte => {
                for (m, report) in self.models.iter().zip(&self.reports) {
                    let per_byte = report.token_rate.per_byte_micro() as f64 / 1e6;
                    put(out, name, &[("model", m)], per_byte);
                }
            }
            Source::Backend(pick) => self.per_backend(out, name, |b| Some(pick(b))),
            Source::Learned(pick) => {
                self.per_backend(out, name, |b| pick(&b.estimates, self.ticks_per_second));
            }
            Source::HitRatio => self.hit_ratios(out, name),
            Source::UpstreamErrors => self.upstream_errors(out, name),
            Source::BackendCounter(pick) => self.backend_counter(out, name, pick),
            Source::Tenant(key, values, pick) => {
                for (index, t) in self.tenants.iter().enumerate() {
                    for (i, value) in values.iter().enumerate() {
                        let n: u64 = (self.shards.iter())
                            .filter_map(|s| pick(s).get(index))
                            .map(|pair| pair[i].load(Ordering::Relaxed))
                            .sum();
                        put(out, name, &[("tenant", t), (key, value)], n);
                    }
                }
            }
            Source::Shards(pick) => put(out, name, &[], self.sum_shards(pick)),
            Source::Router(pick) => put(out, name, &[], pick(self.shared, self.gen)),
        }
    }

    fn statuses(&self, out: &mut String, name: &str) {
        for (model, m) in self.models.iter().enumerate() {
            for status in 100..STATUS_SLOTS {
                let n = self.sum_model(model, |counters| &counters.status[status]);
                if n > 0 {
                    put(out, name, &[("model", m), ("status", &status.to_string())], n);
                }
            }
            for (tenant, t) in (1u16..).zip(&self.tenants) {
                let mut counts = std::collections::BTreeMap::new();
                for part in self.of_tenant(model, tenant) {
                    for (status, n) in part.status.counts() {
                        *counts.entry(status).or_insert(0) += n;
                    }
                }
                for (status, n) in counts {
                    let labels =
                        [("model", m.as_str()), ("status", &status.to_string()), ("tenant", t)];
                    put(out, name, &labels, n);
                }
            }
        }
    }

    /// `warmpath_admitted_total`: per model and lane, from the reports while no tenant was ever
    /// configured (exactly as before tenants existed), else from the shards' counts, tenant by
    /// tenant.
    fn admitted(&self, out: &mut String, name: &str) {
        if self.tenants.is_empty() {
            return self.per_lane(out, name, |r, lane| r.stats.admitted[lane as usize]);
        }
        for (model, m) in self.models.iter().enumerate() {
            for lane in Lane::ALL {
                let n = self.sum_model(model, |c| &c.admitted[lane as usize]);
                put(out, name, &[("model", m), ("lane", lane.name())], n);
            }
            for (tenant, t) in (1u16..).zip(&self.tenants) {
                if self.of_tenant(model, tenant).next().is_none() {
                    continue;
                }
                for lane in Lane::ALL {
                    let parts = self.of_tenant(model, tenant);
                    let n: u64 =
                        parts.map(|p| p.admitted[lane as usize].load(Ordering::Relaxed)).sum();
                    put(out, name, &[("model", m), ("lane", lane.name()), ("tenant", t)], n);
                }
            }
        }
    }

    fn lane_histograms(
        &self,
        out: &mut String,
        name: &str,
        pick: fn(&ModelMetrics, Lane) -> &Histogram,
    ) {
        for (model, m) in self.models.iter().enumerate() {
            for lane in Lane::ALL {
                let parts = self.of_model(model).map(|counters| pick(counters, lane));
                shard_histogram(out, name, &[("model", m), ("lane", lane.name())], parts);
            }
        }
    }

    /// Per model and turn bucket: `pick`'s histogram, or with `None` the TTFT histograms,
    /// also per predicted prefix.
    fn turn_histograms(
        &self,
        out: &mut String,
        name: &str,
        pick: Option<fn(&ModelMetrics, usize) -> &Histogram>,
    ) {
        for (model, m) in self.models.iter().enumerate() {
            for (turn, turn_label) in TURN_BUCKETS.iter().enumerate() {
                let labels = [("model", m.as_str()), ("turn", turn_label)];
                let Some(pick) = pick else {
                    for (warm, prefix) in PREFIX_LABELS.iter().enumerate().rev() {
                        let parts = self.of_model(model).map(|c| &c.ttft[turn][warm]);
                        shard_histogram(
                            out,
                            name,
                            &[&labels[..], &[("prefix", prefix)]].concat(),
                            parts,
                        );
                    }
                    continue;
                };
                shard_histogram(out, name, &labels, self.of_model(model).map(|c| pick(c, turn)));
            }
            if pick.is_none() {
                self.tenant_ttft(out, name, model);
            }
        }
    }

    /// The TTFT histograms of model `model`'s tenants, those with an observation.
    fn tenant_ttft(&self, out: &mut String, name: &str, model: usize) {
        let m = self.models[model].as_str();
        for (tenant, t) in (1u16..).zip(&self.tenants) {
            for (turn, turn_label) in TURN_BUCKETS.iter().enumerate() {
                for (warm, prefix) in PREFIX_LABELS.iter().enumerate().rev() {
                    let parts = || self.of_tenant(model, tenant).map(|p| &p.ttft[turn][warm]);
                    if parts().all(Histogram::is_empty) {
                        continue;
                    }
                    let labels =
                        [("model", m), ("turn", turn_label), ("prefix", prefix), ("tenant", t)];
                    shard_histogram(out, name, &labels, parts());
                }
            }
        }
    }

    fn per_lane(&self, out: &mut String, name: &str, pick: fn(&Report, Lane) -> u64) {
        for (m, report) in self.models.iter().zip(&self.reports) {
            for lane in Lane::ALL {
                put(out, name, &[("model", m), ("lane", lane.name())], pick(report, lane));
            }
        }
    }

    fn match_ratio(&self, out: &mut String, name: &str) {
        for (m, report) in self.models.iter().zip(&self.reports) {
            let buckets = report.stats.match_ratio.iter().enumerate();
            let buckets = buckets.map(|(tenth, &n)| (tenth as f64 / 10.0, n));
            let sum = report.stats.match_ratio_sum_milli as f64 / 1000.0;
            histogram(out, name, &[("model", m)], buckets, 0, sum);
        }
    }

    /// One series per backend of every model, when `value` has one.
    fn per_backend<V: Display>(
        &self,
        out: &mut String,
        name: &str,
        value: impl Fn(&BackendReport) -> Option<V>,
    ) {
        for (model, m) in self.models.iter().enumerate() {
            for (a, b) in self.backends[model].iter().zip(&self.reports[model].backends) {
                if let Some(v) = value(b) {
                    put(out, name, &[("model", m), ("backend", a)], v);
                }
            }
        }
    }

    fn hit_ratios(&self, out: &mut String, name: &str) {
        for (model, m) in self.models.iter().enumerate() {
            for (a, b) in self.backends[model].iter().zip(&self.reports[model].backends) {
                for (source, ratio) in hit_ratios(&b.estimates) {
                    if let Some(ratio) = ratio {
                        put(out, name, &[("model", m), ("backend", a), ("source", source)], ratio);
                    }
                }
            }
        }
    }

    fn upstream_errors(&self, out: &mut String, name: &str) {
        for (model, m) in self.models.iter().enumerate() {
            for (backend, a) in self.backends[model].iter().enumerate() {
                for kind in UpstreamError::ALL {
                    let n = self.sum_model(model, |counters| {
                        counters.upstream_errors.get(backend).map_or(&ZERO, |k| &k[kind as usize])
                    });
                    put(out, name, &[("model", m), ("backend", a), ("kind", kind.name())], n);
                }
            }
        }
    }

    fn backend_counter(
        &self,
        out: &mut String,
        name: &str,
        pick: fn(&ModelMetrics) -> &[AtomicU64],
    ) {
        for (model, m) in self.models.iter().enumerate() {
            for (backend, a) in self.backends[model].iter().enumerate() {
                let n = self.sum_model(model, |c| pick(c).get(backend).unwrap_or(&ZERO));
                put(out, name, &[("model", m), ("backend", a)], n);
            }
        }
    }

    fn sum_shards(&self, pick: impl Fn(&ShardMetrics) -> &AtomicU64) -> u64 {
        self.shards.iter().map(|s| pick(s).load(Ordering::Relaxed)).sum()
    }

    /// The counters of model `index` in the shards that know the model.
    fn of_model(&self, index: usize) -> impl Iterator<Item = &ModelMetrics> {
        self.shards.iter().filter_map(move |s| s.models.get(index))
    }

    /// The counters of tenant `tenant` for model `model`, in the shards where it has any.
    fn of_tenant(&self, model: usize, tenant: u16) -> impl Iterator<Item = &TenantMetrics> {
        self.of_model(model).filter_map(move |m| m.tenant_if_seen(tenant))
    }

    /// A counter of model `index` summed over the shards that know the model.
    fn sum_model(&self, index: usize, pick: impl Fn(&ModelMetrics) -> &AtomicU64) -> u64 {
        self.of_model(index).map(|m| pick(m).load(Ordering::Relaxed)).sum()
    }
}

/// Every model's scheduler report as last published, by model index.
pub(super) fn reports(generation: &Generation) -> Vec<Report> {
    let models = generation.models.iter();
    models.map(|m| m.report.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect()
}

/// The predicted and the engine-reported hit ratio of a backend, when known: the last closed
/// calibration period's; for the engine, before any period closed, its counters' last interval.
pub(super) fn hit_ratios(e: &BackendEstimates) -> [(&'static str, Option<f64>); 2] {
    let closed = e.hit_ratio_at > 0;
    let engine = if closed { Some(e.engine_hit_micro) } else { e.counter_hit_micro };
    [
        ("predicted", closed.then(|| e.predicted_hit_micro as f64 / 1e6)),
        ("engine", engine.map(|micro| micro as f64 / 1e6)),
    ]
}

/// A zero for counters a shard does not have yet (it has not adopted the newest generation).
static ZERO: AtomicU64 = AtomicU64::new(0);

/// A Prometheus label value, escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// One series: `name{k="v",...} value` (label values already escaped).
fn put(out: &mut String, name: &str, labels: &[(&str, &str)], value: impl Display) {
    out.push_str(name);
    for (i, (key, value)) in labels.iter().enumerate() {
        out.push(if i == 0 { '{' } else { ',' });
        let _ = write!(out, "{key}=\"{value}\"");
    }
    if !labels.is_empty() {
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// One histogram's series from the shards' histograms of the same buckets (non-cumulative
/// in microseconds in, cumulative in seconds out); none when no shard has one.
fn shard_histogram<'h>(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    parts: impl Iterator<Item = &'h Histogram>,
) {
    let mut bounds: &[u64] = &[];
    let mut sums = Vec::new();
    for part in parts {
        if sums.is_empty() {
            bounds = part.bounds();
            sums = vec![0; bounds.len() + 2];
        }
        part.sum_into(&mut sums);
    }
    if sums.is_empty() {
        return;
    }
    let buckets = bounds.iter().zip(&sums).map(|(&bound, &n)| (bound as f64 / 1e6, n));
    let sum = sums[bounds.len() + 1] as f64 / 1e6;
    histogram(out, name, labels, buckets, sums[bounds.len()], sum);
}

/// A histogram's `_bucket`, `_sum` and `_count` series from its buckets (upper bound, count
/// in it), the count above the last bound, and the sum of observations.
fn histogram(
    out: &mut String,
    name: &str,
    labels: &[(&str, &str)],
    buckets: impl Iterator<Item = (f64, u64)>,
    above: u64,
    sum: f64,
) {
    let (bucket, sum_name, count_name) =
        (format!("{name}_bucket"), format!("{name}_sum"), format!("{name}_count"));
    let mut cumulative = 0;
    for (bound, n) in buckets {
        cumulative += n;
        let le = bound.to_string();
        put(out, &bucket, &[labels, &[("le", le.as_str())]].concat(), cumulative);
    }
    cumulative += above;
    put(out, &bucket, &[labels, &[("le", "+Inf")]].concat(), cumulative);
    put(out, &sum_name, labels, sum);
    put(out, &count_name, labels, cumulative);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_unique_well_named_and_documented() {
        let docs = include_str!("../../docs/metrics.md");
        let mut seen = std::collections::HashSet::new();
        for family in FAMILIES {
            let name = family.name;
            assert!(seen.insert(name), "{name} is in the table twice");
            assert!(
                name.starts_with("warmpath_")
                    && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{name}: not a warmpath_ snake_case name"
            );
            assert!(["counter", "gauge", "histogram"].contains(&family.kind), "{name}");
            assert_eq!(
                name.ends_with("_total"),
                family.kind == "counter",
                "{name}: `_total` iff a counter"
            );
            let labels = family.source.labels().join(",");
            let row = match labels.is_empty() {
                true => format!("| `{name}` | {} |", family.kind),
                false => format!("| `{name}{{{labels}}}` | {} |", family.kind),
            };
            assert!(docs.contains(&row), "docs/metrics.md has no row starting {row:?}");
        }
    }

    #[test]
    fn every_documented_family_is_exposed() {
        let docs = include_str!("../../docs/metrics.md");
        let rows = docs.lines().filter(|l| l.starts_with("| `warmpath_")).count();
        assert_eq!(rows, FAMILIES.len(), "docs/metrics.md documents families /metrics lacks");
    }

    #[test]
    fn series_escape_label_values_and_histograms_accumulate() {
        let mut out = String::new();
        put(&mut out, "x", &[], 3);
        put(&mut out, "y", &[("model", &label("a\"b\\c\nd")), ("lane", "normal")], 1.5);
        histogram(&mut out, "h", &[("model", "m")], [(0.5, 2), (1.0, 3)].into_iter(), 1, 4.25);
        let expected = "x 3\n\
                        y{model=\"a\\\"b\\\\c\\nd\",lane=\"normal\"} 1.5\n\
                        h_bucket{model=\"m\",le=\"0.5\"} 2\n\
                        h_bucket{model=\"m\",le=\"1\"} 5\n\
                        h_bucket{model=\"m\",le=\"+Inf\"} 6\n\
                        h_sum{model=\"m\"} 4.25\n\
                        h_count{model=\"m\"} 6\n";
        assert_eq!(out, expected);
    }
}
