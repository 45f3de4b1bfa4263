//! Live reconfiguration: on SIGHUP or `POST /admin/reload`, read the configuration file again
//! (with the same environment and command-line overrides) and apply it without dropping a
//! connection or a queued request.
//!
//! A reload builds a new [`Generation`] from the file and the active one (model and backend
//! indices stay stable; see `generation.rs`), hands the schedulers of new models to their home
//! shards' mailboxes, gives the control thread its new targets, and publishes the generation.
//! Each shard adopts it at the top of its next loop iteration (or before acting on an admission
//! that names a backend it does not know yet): it grows its pools and counters, closes idle
//! connections to removed backends, and reconfigures the schedulers it hosts
//! ([`Scheduler::reconfigure`](crate::scheduler::Scheduler::reconfigure)) on its own thread,
//! so each scheduler keeps its single writer. A file that does not load or validate, or a new
//! backend that does not resolve, is refused: the active generation stays, and the error is
//! returned and logged.
//!
//! A reload returns once every shard has adopted the new generation (each says so in
//! `Shared::adopted`), so that what follows a `200` from `POST /admin/reload` (a request, a
//! look at `/debug/queue`) meets the new configuration everywhere. Adoption takes one loop
//! iteration of each shard, woken by the publication; a shard that has not adopted within
//! [`ADOPTION_WAIT`] (one that stopped, or is stuck) is named in the log, and the reload
//! returns anyway: the generation is published, and that shard adopts it when it next runs.
//!
//! [`refresh`] is the same without the file: the control thread calls it when a backend's
//! host name no longer resolves to the address in use (`control::prober`), and it builds a
//! generation of the running configuration with every name resolved again, published only if
//! an address changed.
//!
//! Keys that cannot change in a running process keep their running value, with a warning:
//! the listeners, `shards`, `pin_cores`, `access_log`, and each model's `max_sessions` (the
//! session tracker's capacity is fixed at start). `/debug/config` shows what is in effect.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::control::thread::{ControlSettings, Plan};

use super::generation::NewHost;
use super::{Generation, Shared};

/// How long a reload waits for every shard to adopt the generation it published.
pub const ADOPTION_WAIT: Duration = Duration::from_secs(1);

/// Reloads the configuration file into a new generation and waits for every shard to adopt it
/// (module doc); returns its number, or why the file was refused (the active generation
/// stays). Logs either way on standard error.
pub fn reload(shared: &Shared) -> Result<u64, String> {
    // Whatever the file holds: after logrotate moved the access log, a reload (its
    // `postrotate`) makes the writer open a new one at the path.
    if let Some(log) = shared.access_logs.first() {
        log.reopen();
    }
    let result = publish(shared);
    if let Ok(number) = result {
        let behind = shared.await_adoption(number, ADOPTION_WAIT);
        if !behind.is_empty() {
            eprintln!(
                "warmpath: reload: generation {number} published; shards {behind:?} had not \
                 adopted it after {ADOPTION_WAIT:?}"
            );
        }
    }
    result
}

/// Reloads the configuration file into a new generation and publishes it, without waiting for
/// the shards; returns its number, or why the file was refused. Logs either way.
pub(super) fn publish(shared: &Shared) -> Result<u64, String> {
    let result = try_reload(shared);
    match &result {
        Ok(number) => eprintln!("warmpath: reload: generation {number} active"),
        Err(error) => {
            shared.reloads_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            eprintln!(
                "warmpath: reload refused, generation {} stays: {error}",
                shared.generation().number
            );
        }
    }
    result
}

fn try_reload(shared: &Shared) -> Result<u64, String> {
    let _reload = reload_lock(shared)?;
    let Some(source) = &shared.source else {
        return Err("no configuration file to reload (started without --config)".into());
    };
    let config = Config::load(Some(&source.path), &source.env, &source.overrides)
        .map_err(|e| e.to_string())?;
    let active = shared.generation();
    let (config, kept) = keep_restart_only(&active.config, config);
    let (generation, hosts) = next(shared, &active, config)?;
    let number = generation.number;
    for warning in kept {
        eprintln!("warmpath: reload: {warning}");
    }
    for warning in generation.config.warnings() {
        eprintln!("warmpath: reload: warning: {warning}");
    }
    install(shared, generation, hosts);
    Ok(number)
}

/// Resolves the backends' host names again into a new generation of the running
/// configuration (the control thread calls it when a name no longer resolves to the address
/// its backend is reached at), and publishes it if an address changed. Logs what it does; a
/// failure (only: shutting down) is logged and changes nothing.
pub fn refresh(shared: &Shared) {
    let Ok(_reload) = reload_lock(shared) else { return };
    let active = shared.generation();
    let (generation, hosts) = match next(shared, &active, active.config.clone()) {
        Ok(built) => built,
        Err(error) => return eprintln!("warmpath: re-resolving backends failed: {error}"),
    };
    let addresses = |g: &Generation| -> Vec<SocketAddr> {
        g.models.iter().flat_map(|m| m.backends.iter().map(|b| b.addr)).collect()
    };
    if addresses(&generation) == addresses(&active) {
        return;
    }
    let number = generation.number;
    install(shared, generation, hosts);
    eprintln!("warmpath: backends re-resolved: generation {number} active");
}

/// The reload lock, unless the router is shutting down (then nothing may change).
fn reload_lock(shared: &Shared) -> Result<std::sync::MutexGuard<'_, ()>, String> {
    let lock = shared.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
    match shared.shutting_down.load(std::sync::atomic::Ordering::Acquire) {
        true => Err("shutting down".into()),
        false => Ok(lock),
    }
}

/// The generation after `active`, of `config`, on the router's rings, clock and resolver.
fn next(
    shared: &Shared,
    active: &Generation,
    config: Config,
) -> Result<(Generation, Vec<NewHost>), String> {
    let (clock, rings) = (&shared.clock, &shared.rings);
    Generation::build(active.number + 1, config, Some(active), clock, rings, shared.resolver)
}

/// Hands `generation`'s new schedulers to their shards, its targets to the control thread,
/// and publishes it.
fn install(shared: &Shared, generation: Generation, hosts: Vec<NewHost>) {
    for new in hosts {
        let mut mailbox = shared.new_hosts[new.home].lock().unwrap_or_else(|e| e.into_inner());
        mailbox.push((new.model, new.host));
    }
    let plan = Plan {
        targets: generation.targets(),
        settings: ControlSettings::from_config(&generation.config.upstream),
    };
    *shared.control_plan.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(plan);
    shared.publish(Arc::new(generation));
}

/// `new` with the running values of the keys a running process cannot change, and a warning
/// for each one the file changed.
fn keep_restart_only(active: &Config, mut new: Config) -> (Config, Vec<String>) {
    let mut kept = Vec::new();
    let (old, server) = (&active.server, &mut new.server);
    let mut keep = |key: &str, changed: bool, running: String| {
        if changed {
            kept.push(format!("server.{key} needs a restart; keeping {running}"));
        }
    };
    keep("listen", server.listen != old.listen, old.listen.to_string());
    keep("admin_listen", server.admin_listen != old.admin_listen, old.admin_listen.to_string());
    keep("shards", server.shards != old.shards, old.shards.to_string());
    keep("pin_cores", server.pin_cores != old.pin_cores, old.pin_cores.to_string());
    keep("access_log", server.access_log != old.access_log, old.access_log.name());
    server.listen = old.listen;
    server.admin_listen = old.admin_listen;
    server.shards = old.shards;
    server.pin_cores = old.pin_cores;
    server.access_log = old.access_log.clone();
    // Issue [11]: the Redis store's thread is started with the process.
    if new.rate_limit != active.rate_limit {
        kept.push(format!(
            "rate_limit.store and rate_limit.redis_url need a restart; keeping {} and {:?}",
            active.rate_limit.store.name(),
            active.rate_limit.redis_url
        ));
        new.rate_limit = active.rate_limit.clone();
    }
    for model in &mut new.models {
        let Some(running) = active.model(&model.name) else { continue };
        if model.queue.max_sessions != running.queue.max_sessions {
            kept.push(format!(
                "model {:?}: queue.max_sessions needs a restart; keeping {}",
                model.name, running.queue.max_sessions
            ));
            model.queue.max_sessions = running.queue.max_sessions;
        }
        // S16's prompt pool and indexes are built with the scheduler.
        let prefix_cost = |routing| routing == crate::config::Routing::PrefixCost;
        if prefix_cost(model.routing) != prefix_cost(running.routing) {
            kept.push(format!(
                "model {:?}: routing to or from prefix-cost needs a restart; keeping {}",
                model.name,
                running.routing.name()
            ));
            model.routing = running.routing;
        }
        let (queue, old) = (&mut model.queue, &running.queue);
        if (queue.prefix_block_bytes, queue.prefix_index_blocks)
            != (old.prefix_block_bytes, old.prefix_index_blocks)
        {
            kept.push(format!(
                "model {:?}: queue.prefix_block_bytes and queue.prefix_index_blocks need a \
                 restart; keeping {} and {}",
                model.name, old.prefix_block_bytes, old.prefix_index_blocks
            ));
            queue.prefix_block_bytes = old.prefix_block_bytes;
            queue.prefix_index_blocks = old.prefix_index_blocks;
        }
    }
    (new, kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    #[test]
    fn restart_only_keys_keep_their_running_values() {
        let active = Config::with_models(vec![ModelConfig::new("m", vec!["a:1".into()])]);
        let mut new = active.clone();
        new.server.shards = 7;
        new.server.listen = "127.0.0.1:1".parse().unwrap();
        new.queue.timeout = std::time::Duration::from_secs(3);
        new.models[0].queue.max_sessions = 3;
        new.models[0].queue.max_overtakes = 5;
        let (kept, warnings) = keep_restart_only(&active, new);
        assert_eq!(kept.server.shards, active.server.shards);
        assert_eq!(kept.server.listen, active.server.listen);
        assert_eq!(kept.models[0].queue.max_sessions, active.models[0].queue.max_sessions);
        assert_eq!(kept.models[0].queue.max_overtakes, 5, "live keys change");
        assert_eq!(kept.queue.timeout, std::time::Duration::from_secs(3));
        assert_eq!(warnings.len(), 3, "{warnings:?}");
    }
}
