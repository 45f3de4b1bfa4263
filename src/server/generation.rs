//! Configuration generations: what the dataplane reads of the configuration, rebuilt whole on
//! each live reload and swapped in by every thread at its own pace.
//!
//! A [`Generation`] is immutable once published. Model and backend *indices are stable across
//! generations*: a model or backend that leaves the configuration stays in the tables, marked
//! not `live` (a removed model answers 404 to new requests while its queued and in-flight ones
//! finish; a removed backend gets no new admissions while its in-flight ones finish), and one
//! that comes back takes its old index. New ones are appended. So a request, a pool, a counter or
//! a scheduler slot indexed under one generation means the same thing under the next, and
//! threads never have to agree on a switch-over moment. The price: the tables only grow, so a
//! model's backend table is capped at [`BACKENDS_MAX`] entries, live or not (a restart compacts).
//!
//! Tenants (issue \[11\]) are kept the same way, by name: tenant *t* (from 1; 0 is "no tenant")
//! is `tenants[t - 1]` in every generation, so a request's tenant index and each shard's
//! per-tenant counters mean the same across a reload. Only live tenants' keys are in the
//! generation's [`KeyTable`], so a removed tenant's keys stop working in the first generation
//! without it, while its requests already admitted finish.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hashbrown::HashMap;

use std::time::Duration;

use crate::clock::{Clock, TickRate};
use crate::config::{self, Config, ModelConfig, Setting, Strategy, TenantConfig, UpstreamConfig};
use crate::control::prober::{is_host_name, moved_to, Resolver};
use crate::control::scrape::EngineKind;
use crate::control::thread::Target;
use crate::credential::{BackendKey, Digest, KeyTable};
use crate::protocol::Limits;
use crate::ring::prompt_pool::PromptPool;
use crate::ring::{InboxWaker, Ring};
use crate::scheduler::cache_model::INDEX_DEFAULT_BLOCKS;
use crate::scheduler::estimate;
use crate::scheduler::{Budget, IndexSize, Params, PrefixParams, Routing, Scheduler};

use super::host::{Host, Inbox};
use super::report::Report;
use super::{ShardHost, ShardRing, RING_CAPACITY};

/// Backends a model's table may hold, removed ones included.
pub const BACKENDS_MAX: usize = 1024;
/// Models the table may hold, removed ones included.
pub const MODELS_MAX: usize = 1024;
/// Tenants the table may hold, removed ones included (tenant indices are 16-bit, 0 = none).
pub const TENANTS_MAX: usize = 4096;

/// The tenant index of a request that names no tenant: none is configured, or its route needs
/// no key. Configured tenants are 1, 2, ...
pub const NO_TENANT: u16 = 0;

/// A tenant as the dataplane sees it (issue \[11\]).
#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    /// Its configuration, as of the last generation it was configured in.
    pub config: TenantConfig,
    /// In the configuration of this generation (else its keys are refused).
    pub live: bool,
}

/// One backend of a model.
#[derive(Debug, Clone)]
pub struct BackendAddr {
    /// The resolved address.
    pub addr: SocketAddr,
    /// `host:port` as configured: the `Host` sent to an HTTP/1.0 client's backend, and the
    /// metrics label.
    pub authority: String,
    /// In the configuration of this generation (else it only finishes its in-flight requests).
    pub live: bool,
}

/// A model as the dataplane sees it.
#[derive(Debug, Clone)]
pub struct Model {
    pub name: String,
    /// Its effective configuration, as of the last generation it was configured in.
    pub config: ModelConfig,
    /// The in-place rewrite of `"model"`: `upstream_model` as a JSON string token.
    pub upstream_model_json: Option<Vec<u8>>,
    /// The `Authorization` its engines require (`backend_api_key_file`, read when this
    /// generation was built), sent in place of the client's.
    pub backend_key: Option<BackendKey>,
    /// The session header, lowercase.
    pub session_header: String,
    /// Issue \[10\]: where a request's session identity comes from, in order (the first present
    /// wins), resolved against the generation's [`Generation::body_fields`].
    pub session_sources: Vec<SessionSource>,
    pub backends: Vec<BackendAddr>,
    pub inbox: Arc<Inbox>,
    pub report: Arc<Mutex<Report>>,
    /// S16: where shards put the block hashes of a request's prompt (`routing = "prefix-cost"`
    /// when the model was created; see `reload`).
    pub prompts: Option<Arc<PromptPool>>,
    /// In the configuration of this generation (else it takes no new requests).
    pub live: bool,
}

impl Model {
    /// Which backends are live, by index.
    pub fn live_backends(&self) -> Vec<bool> {
        self.backends.iter().map(|b| b.live).collect()
    }
}

/// One session source of a model, as the shard looks it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionSource {
    /// A request header, lowercase. `strict` for the model's `session_header`, whose invalid
    /// values are refused (400, SPEC 2.4) as they always were; any other header's invalid value
    /// counts as absent.
    Header { name: String, strict: bool },
    /// A top-level body field: its index in [`Generation::body_fields`].
    Body(usize),
}

/// The configuration as the dataplane reads it, one generation.
#[derive(Debug)]
pub struct Generation {
    /// 1 at start, one more per accepted reload.
    pub number: u64,
    pub config: Config,
    /// Every model ever configured since start, by stable index.
    pub models: Vec<Model>,
    /// Live model name to index.
    pub by_name: HashMap<String, u16>,
    /// Request limits of `[server]` with `[queue].session_header`.
    pub limits: Limits,
    /// The body of `GET /v1/models`.
    pub models_json: Vec<u8>,
    /// The prompt block size of the live models that hash prompts (prefix-cost), when there
    /// are any: the shards hash every body in the pass that finds its model.
    pub prompt_block_bytes: Option<usize>,
    /// The `body:` session source fields of every model, each once: the body scan records them
    /// all in the pass that finds the model (which it does not know before), and each model's
    /// sources pick theirs by index.
    pub body_fields: Vec<Box<[u8]>>,
    /// Every tenant configured since start: tenant `t` is `tenants[t - 1]` (issue \[11\]).
    pub tenants: Vec<Tenant>,
    /// The live tenants' key digests, each naming its tenant index. Empty: the main listener
    /// is open.
    pub keys: KeyTable,
    /// `server.admin_token_sha256`.
    pub admin_token: Option<Digest>,
    /// `[server.tls]`, its files read when this generation was built (`server::tls`): the
    /// configuration new client connections handshake with; `None` = plaintext.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// A model that needs a scheduler: the host to run on shard `home`.
#[derive(Debug)]
pub struct NewHost {
    pub home: usize,
    pub model: u16,
    pub host: ShardHost,
}

impl Generation {
    /// Generation `number` of `config`, reusing the models and backends of `previous` (and
    /// their inboxes and reports); new models get a scheduler, returned as [`NewHost`]s for
    /// their home shards. Backends named by host name are resolved with `resolver`, the kept
    /// ones again ([`update_model`]). Fails when a new backend does not resolve or a table
    /// would overflow.
    pub fn build(
        number: u64,
        config: Config,
        previous: Option<&Generation>,
        clock: &Clock,
        rings: &[Arc<ShardRing>],
        resolver: Resolver,
    ) -> Result<(Generation, Vec<NewHost>), String> {
        let mut models: Vec<Model> = previous.map_or_else(Vec::new, |p| p.models.clone());
        // A model that leaves the configuration keeps its backends as they were, so that its
        // queued requests are still served; it only stops taking new ones.
        for model in &mut models {
            model.live = false;
        }
        let mut hosts = Vec::new();
        let tenants = tenants(previous, &config.tenants)?;
        let weights = tenant_weights(&tenants);
        for model_config in &config.models {
            let index = match models.iter().position(|m| m.name == model_config.name) {
                Some(index) => index,
                None => {
                    if models.len() >= MODELS_MAX {
                        return Err(format!("more than {MODELS_MAX} models since start"));
                    }
                    let home = models.len() % rings.len();
                    let (model, host) =
                        new_model(model_config, &config, &weights, clock, rings, home, resolver)?;
                    models.push(model);
                    let model = u16::try_from(models.len() - 1).expect("MODELS_MAX fits u16");
                    hosts.push(NewHost { home, model, host });
                    models.len() - 1
                }
            };
            let model = &mut models[index];
            update_model(model, model_config, resolver)?;
        }
        let body_fields = resolve_session_sources(&mut models);
        let by_name = (0u16..)
            .zip(&models)
            .filter(|(_, m)| m.live)
            .map(|(i, m)| (m.name.clone(), i))
            .collect();
        let limits = Limits {
            max_header_bytes: config.server.max_header_bytes as usize,
            max_body_bytes: config.server.max_body_bytes,
            session_header: config.queue.session_header.to_ascii_lowercase(),
            ..Limits::default()
        };
        let keys = KeyTable::new(tenants.iter().zip(1u16..).filter(|(t, _)| t.live).flat_map(
            |(tenant, index)| tenant.config.api_key_sha256.iter().map(move |d| (*d, index)),
        ));
        let admin_token = config.server.admin_token_sha256;
        let tls = match config.server.tls.files() {
            Some((cert, key)) => {
                Some(super::tls::load(cert, key, crate::clock::wall_time().as_secs())?)
            }
            None => None,
        };
        let models_json = models_json(&models);
        let prompt_block_bytes = models
            .iter()
            .filter(|m| m.live && m.prompts.is_some())
            .map(|m| m.config.queue.prefix_block_bytes as usize)
            .max();
        let generation = Generation {
            number,
            config,
            models,
            by_name,
            limits,
            models_json,
            prompt_block_bytes,
            body_fields,
            tenants,
            keys,
            admin_token,
            tls,
        };
        Ok((generation, hosts))
    }

    /// The scheduler parameters of model `index` in this generation (its backend count is the
    /// whole table's, removed backends included).
    pub fn params(&self, index: usize, rate: TickRate) -> Params {
        let model = &self.models[index];
        let mut params = scheduler_params(&model.config, &self.config.upstream, rate);
        params.backends = u16::try_from(model.backends.len()).expect("BACKENDS_MAX fits u16");
        params.tenant_weights = tenant_weights(&self.tenants);
        params
    }

    /// The control thread's targets: every live backend of every live model.
    pub fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        for model in self.models.iter().filter(|m| m.live) {
            for (index, backend) in (0u16..).zip(&model.backends) {
                if backend.live {
                    targets.push(Target {
                        inbox: Arc::clone(&model.inbox),
                        backend: index,
                        addr: backend.authority.clone(),
                        resolved: Some(backend.addr),
                        engine: EngineKind::for_engine(model.config.engine),
                        key: model.backend_key.clone(),
                    });
                }
            }
        }
        targets
    }

    /// Whether the main listener asks for API keys: some live tenant is configured.
    pub fn auth_required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Tenant `index` ([`NO_TENANT`] is none).
    pub fn tenant(&self, index: u16) -> Option<&Tenant> {
        self.tenants.get(usize::from(index).checked_sub(1)?)
    }

    /// The name of tenant `index` ([`NO_TENANT`] has none).
    pub fn tenant_name(&self, index: u16) -> Option<&str> {
        let slot = usize::from(index).checked_sub(1)?;
        Some(self.tenants[slot].name.as_str())
    }

    /// Whether every live model has at least one healthy, non-ejected live backend (`/readyz`).
    pub fn ready(&self) -> bool {
        self.models.iter().filter(|m| m.live).all(|model| {
            let report = model.report.lock().unwrap_or_else(|e| e.into_inner());
            (model.backends.iter().zip(&report.backends))
                .any(|(backend, b)| backend.live && b.healthy && !b.ejected)
        })
    }
}

/// The scheduler parameters of `model` (its effective queue) under `upstream`, with durations
/// converted at `rate`; the wheel ticks at about a millisecond.
pub fn scheduler_params(model: &ModelConfig, upstream: &UpstreamConfig, rate: TickRate) -> Params {
    let queue = &model.queue;
    let routing = match model.routing {
        config::Routing::SessionAffinity => Routing::SessionAffinity,
        config::Routing::LeastInflight => Routing::LeastInflight,
        config::Routing::RoundRobin => Routing::RoundRobin,
        config::Routing::PrefixCost => Routing::PrefixCost,
    };
    let backends = u16::try_from(model.backends.len()).expect("validated backend count");
    Params {
        boost: queue.strategy == Strategy::SessionBoost,
        routing,
        backends,
        queue_timeout: (!queue.timeout.is_zero()).then(|| rate.ticks(queue.timeout)),
        max_queued: queue.max_queued,
        inflight_per_backend: match queue.inflight_per_backend {
            Setting::Auto => estimate::INFLIGHT_UNLEARNED,
            Setting::Fixed(cap) => cap,
        },
        inflight_learned: queue.inflight_per_backend == Setting::Auto,
        prefill_tokens_per_backend: match queue.prefill_tokens_per_backend {
            Setting::Auto => Budget::Auto,
            Setting::Fixed(tokens) => Budget::Tokens(tokens),
        },
        max_sessions: queue.max_sessions,
        max_overtakes: queue.max_overtakes,
        boosted_streak_max: queue.boosted_streak_max,
        grace_period: rate.ticks(queue.grace_period),
        max_retries: upstream.max_retries,
        eject_after_failures: upstream.eject_after_failures,
        metrics_stale_after: rate.ticks(upstream.metrics_stale_after),
        timer_resolution: rate.ticks(Duration::from_millis(1)),
        prefix: PrefixParams {
            block_bytes: queue.prefix_block_bytes,
            index_blocks: match queue.prefix_index_blocks {
                Setting::Auto => IndexSize::Auto { default_blocks: INDEX_DEFAULT_BLOCKS },
                Setting::Fixed(blocks) => IndexSize::Blocks(blocks),
            },
            scan_max: queue.placement_scan_max,
            slack_tokens: queue.cost_slack_tokens,
            wait_max: rate.ticks(queue.affinity_wait_max),
            derive_sessions: queue.derive_sessions,
            hot_touches: crate::scheduler::HOT_PREFIX_TOUCHES,
        },
        tenant_weights: Vec::new(),
    }
}

/// Issue \[11\]: the fair-share weight of every tenant since start, by index (a removed one keeps
/// its last weight; its keys no longer work, so nothing of it arrives).
fn tenant_weights(tenants: &[Tenant]) -> Vec<u16> {
    tenants.iter().map(|t| u16::try_from(t.config.weight).unwrap_or(u16::MAX)).collect()
}

/// A model's entry and scheduler (`weights`: the tenants' fair-share weights), with its
/// configured backends resolved.
fn new_model(
    model: &ModelConfig,
    config: &Config,
    weights: &[u16],
    clock: &Clock,
    rings: &[Arc<ShardRing>],
    home: usize,
    resolver: Resolver,
) -> Result<(Model, ShardHost), String> {
    let backends = model
        .backends
        .iter()
        .map(|authority| resolve(&model.name, authority, resolver))
        .collect::<Result<Vec<_>, _>>()?;
    let mut params = scheduler_params(model, &config.upstream, clock.rate());
    params.tenant_weights = weights.to_vec();
    let scheduler = Scheduler::new(params, clock.now());
    let prompts = scheduler.prompt_pool();
    let waker = InboxWaker::Loop(Arc::clone(rings[home].waker()));
    let inbox = Arc::new(Ring::new(RING_CAPACITY, waker));
    let host = Host::new(scheduler, Arc::clone(&inbox), rings.to_vec());
    let entry = Model {
        name: model.name.clone(),
        config: model.clone(),
        upstream_model_json: None,
        backend_key: None,
        session_header: String::new(),
        session_sources: Vec::new(),
        backends,
        inbox,
        report: Arc::clone(host.report()),
        prompts,
        live: true,
    };
    Ok((entry, host))
}

/// The tenant table of a generation configuring `configured`: `previous`'s, by name (a tenant
/// that left stays, not live; one that comes back takes its old index), new ones appended.
fn tenants(
    previous: Option<&Generation>,
    configured: &[TenantConfig],
) -> Result<Vec<Tenant>, String> {
    let mut tenants: Vec<Tenant> = previous.map_or_else(Vec::new, |p| p.tenants.clone());
    for tenant in &mut tenants {
        tenant.live = false;
    }
    for config in configured {
        if let Some(tenant) = tenants.iter_mut().find(|t| t.name == config.name) {
            tenant.config = config.clone();
            tenant.live = true;
            continue;
        }
        if tenants.len() >= TENANTS_MAX {
            return Err(format!(
                "more than {TENANTS_MAX} tenants since start (restart to compact)"
            ));
        }
        tenants.push(Tenant { name: config.name.clone(), config: config.clone(), live: true });
    }
    Ok(tenants)
}

/// Sets every model's session sources from its configuration and returns the body fields they
/// name, each once, in the order first named (models in index order).
fn resolve_session_sources(models: &mut [Model]) -> Vec<Box<[u8]>> {
    let mut fields: Vec<Box<[u8]>> = Vec::new();
    for model in models {
        let sources = model.config.queue.effective_session_sources();
        model.session_sources = sources
            .into_iter()
            .map(|source| match source {
                config::SessionSource::Header(name) => {
                    let name = name.to_ascii_lowercase();
                    let strict = name == model.session_header;
                    SessionSource::Header { name, strict }
                }
                config::SessionSource::Body(field) => {
                    let index = match fields.iter().position(|f| **f == *field.as_bytes()) {
                        Some(index) => index,
                        None => {
                            fields.push(field.into_bytes().into_boxed_slice());
                            fields.len() - 1
                        }
                    };
                    SessionSource::Body(index)
                }
            })
            .collect();
    }
    fields
}

/// Brings `model` to `config`: its settings, and its backends (kept by authority, new ones
/// appended and resolved). A kept backend named by host name is resolved again: when the name
/// no longer resolves to its address (and resolves at all), it takes the first it does
/// ([`moved_to`], the prober's rule too), logged; its index and series stay (its prefix index
/// is emptied when the prober reports the new engine, `Snapshot::new_engine`).
fn update_model(model: &mut Model, config: &ModelConfig, resolver: Resolver) -> Result<(), String> {
    model.live = true;
    model.config = config.clone();
    model.upstream_model_json = config.upstream_model.as_deref().map(|name| {
        let mut json = Vec::new();
        crate::protocol::write_json_string(name, &mut json);
        json
    });
    // Read at every generation, so that a reload takes a rotated key.
    model.backend_key = config.backend_key()?;
    model.session_header = config.queue.session_header.to_ascii_lowercase();
    model.backends.iter_mut().for_each(|b| b.live = false);
    for authority in &config.backends {
        match model.backends.iter_mut().find(|b| &b.authority == authority) {
            Some(backend) => {
                backend.live = true;
                let moved = is_host_name(authority)
                    .then(|| moved_to(&resolver(authority), backend.addr))
                    .flatten();
                if let Some(first) = moved {
                    eprintln!(
                        "warmpath: model {:?}: backend {authority} now resolves to {first} \
                         (was {})",
                        model.name, backend.addr
                    );
                    backend.addr = first;
                }
            }
            None => {
                if model.backends.len() >= BACKENDS_MAX {
                    return Err(format!(
                        "model {:?}: more than {BACKENDS_MAX} backends since start (restart to \
                         compact)",
                        model.name
                    ));
                }
                let mut backend = resolve(&model.name, authority, resolver)?;
                backend.live = true;
                model.backends.push(backend);
            }
        }
    }
    Ok(())
}

fn resolve(model: &str, authority: &str, resolver: Resolver) -> Result<BackendAddr, String> {
    match resolver(authority).first().copied() {
        Some(addr) => Ok(BackendAddr { addr, authority: authority.to_owned(), live: true }),
        None => Err(format!("model {model:?}: backend {authority:?} does not resolve")),
    }
}

/// `{"object":"list","data":[{"id":...,"object":"model","created":0,"owned_by":"warmpath"}]}`
/// of the live models.
fn models_json(models: &[Model]) -> Vec<u8> {
    let data: Vec<serde_json::Value> = models
        .iter()
        .filter(|m| m.live)
        .map(|m| {
            serde_json::json!({"id": m.name, "object": "model", "created": 0, "owned_by": "warmpath"})
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({"object": "list", "data": data}))
        .expect("serialising a JSON value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_follow_the_model_configuration() {
        let text = r#"
            [queue]
            max_overtakes = 3
            [upstream]
            max_retries = 1
            [[model]]
            name = "m"
            routing = "round-robin"
            backends = ["127.0.0.1:1", "127.0.0.1:2"]
            [model.queue]
            strategy = "fifo"
            timeout = "0"
            grace_period = "50ms"
        "#;
        let config = crate::config::Config::from_toml_str(text).expect("valid");
        let p =
            scheduler_params(&config.models[0], &config.upstream, crate::clock::TickRate::NANOS);
        assert!(!p.boost);
        assert_eq!(p.routing, Routing::RoundRobin);
        assert_eq!(p.backends, 2);
        assert_eq!(p.queue_timeout, None, "0 = no deadline");
        assert_eq!(p.grace_period, 50_000_000);
        assert_eq!(p.max_overtakes, 3, "the [queue] default reaches the model");
        assert_eq!(p.max_retries, 1);
        assert_eq!(p.inflight_per_backend, 256);
        assert_eq!(p.timer_resolution, 1_000_000);
        assert_eq!(p.prefill_tokens_per_backend, Budget::Auto, "auto by default");
        assert_eq!(p.prefix.index_blocks, IndexSize::Auto { default_blocks: INDEX_DEFAULT_BLOCKS });
        Scheduler::new(p, 0).check_invariants();
    }

    fn tenant(name: &str, key: &[u8]) -> TenantConfig {
        TenantConfig::new(name, vec![crate::credential::digest(key)])
    }

    /// Tenants keep their index by name across generations; only live ones' keys work.
    #[test]
    fn tenant_indices_are_stable_and_removed_tenants_lose_their_keys() {
        let first = tenants(None, &[tenant("a", b"ka"), tenant("b", b"kb")]).unwrap();
        let generation = |tenants: Vec<Tenant>| Generation {
            keys: KeyTable::new(
                tenants
                    .iter()
                    .zip(1u16..)
                    .filter(|(t, _)| t.live)
                    .flat_map(|(t, i)| t.config.api_key_sha256.iter().map(move |d| (*d, i))),
            ),
            tenants,
            ..empty_generation()
        };
        let one = generation(first);
        assert_eq!(one.keys.find(&crate::credential::digest(b"kb")), Some(2));
        assert_eq!((one.tenant_name(0), one.tenant_name(2)), (None, Some("b")));
        let second = tenants(Some(&one), &[tenant("c", b"kc"), tenant("b", b"kb2")]).unwrap();
        let two = generation(second);
        let names: Vec<(&str, bool)> =
            two.tenants.iter().map(|t| (t.name.as_str(), t.live)).collect();
        assert_eq!(names, [("a", false), ("b", true), ("c", true)]);
        let find = |g: &Generation, key: &[u8]| g.keys.find(&crate::credential::digest(key));
        assert_eq!(find(&two, b"ka"), None, "a removed tenant's key stops working");
        assert_eq!(find(&two, b"kb"), None, "a replaced key stops working");
        assert_eq!((find(&two, b"kb2"), find(&two, b"kc")), (Some(2), Some(3)));
        let three = generation(tenants(Some(&two), &[tenant("a", b"ka")]).unwrap());
        assert_eq!(find(&three, b"ka"), Some(1), "a tenant that comes back keeps its index");
        assert!(three.auth_required() && !generation(Vec::new()).auth_required());
    }

    /// What `engine.test:80` resolves to in [`kept_backends_named_by_host_are_resolved_again`]:
    /// 127.0.0.2 at this port, or nothing at port 0.
    static ENGINE_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);

    fn test_resolver(authority: &str) -> Vec<SocketAddr> {
        let port = ENGINE_PORT.load(std::sync::atomic::Ordering::Relaxed);
        match (authority, port) {
            ("engine.test:80", 0) => Vec::new(),
            ("engine.test:80", port) => vec![SocketAddr::from(([127, 0, 0, 2], port))],
            (other, _) => crate::control::prober::system_resolver(other),
        }
    }

    /// A reload (or a refresh) resolves a kept backend's host name again: a new address is
    /// taken at the same index, a name that resolves to nothing keeps the last one, and an IP
    /// address is not resolved; the control thread's targets carry the addresses.
    #[test]
    fn kept_backends_named_by_host_are_resolved_again() {
        use std::sync::atomic::Ordering::Relaxed;
        let poll = mio::Poll::new().expect("a poll");
        let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).expect("a waker"));
        let rings = vec![Arc::new(Ring::new(16, waker))];
        let clock = Clock::real();
        let backends = vec!["engine.test:80".to_owned(), "127.0.0.1:9".to_owned()];
        let config = Config::with_models(vec![ModelConfig::new("m", backends)]);
        let build = |previous: Option<&Generation>| {
            let config = config.clone();
            Generation::build(2, config, previous, &clock, &rings, test_resolver).unwrap().0
        };
        let addrs = |g: &Generation| -> Vec<SocketAddr> {
            g.models[0].backends.iter().map(|b| b.addr).collect()
        };
        let (engine, other) = (|port| SocketAddr::from(([127, 0, 0, 2], port)), "127.0.0.1:9");
        let first = build(None);
        assert_eq!(addrs(&first), [engine(1), other.parse().unwrap()]);
        ENGINE_PORT.store(2, Relaxed);
        let second = build(Some(&first));
        assert_eq!(addrs(&second), [engine(2), other.parse().unwrap()], "moved, same index");
        let resolved: Vec<_> = second.targets().iter().map(|t| t.resolved).collect();
        assert_eq!(resolved, [Some(engine(2)), Some(other.parse().unwrap())]);
        ENGINE_PORT.store(0, Relaxed);
        assert_eq!(addrs(&build(Some(&second))), addrs(&second), "resolves to nothing: kept");
    }

    fn empty_generation() -> Generation {
        Generation {
            number: 1,
            config: Config::with_models(Vec::new()),
            models: Vec::new(),
            by_name: HashMap::new(),
            limits: Limits::default(),
            models_json: Vec::new(),
            prompt_block_bytes: None,
            body_fields: Vec::new(),
            tenants: Vec::new(),
            keys: KeyTable::default(),
            admin_token: None,
            tls: None,
        }
    }
}
