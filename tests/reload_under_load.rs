//! Live reconfiguration under traffic: reloads that change the backends of two models, hosted
//! by two shards, and add and remove a third, while clients send requests to the first two
//! without a pause. No request may be lost or answered with an error, every one must reach
//! exactly one backend, and when the reloads stop, each model's scheduler must have the last
//! generation's backends. The narrow windows in which a shard could leave a scheduler on an
//! older generation are pinned one by one in `src/server/shard/mod.rs`'s tests; this one is
//! the whole path under load.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::backend::Backend;
use support::client::{self, chat_request};
use support::router::{Router, Setup};

/// Every model the router is given: the clients load the first two ([`MODELS`]); `o` comes and
/// goes with the reloads.
const ALL: [&str; 3] = ["m", "n", "o"];

/// The models the clients load.
const MODELS: [&str; 2] = [ALL[0], ALL[1]];

/// The models on `backends`, round-robin (so a scheduler that lacks a backend starves it), on
/// two shards: `m`'s scheduler is hosted by shard 0, `n`'s by shard 1, `o`'s (the third model
/// the router has seen) by shard 0.
fn setup(backends: &[&Backend], with_o: bool) -> Setup {
    let addresses: Vec<String> = backends.iter().map(|b| b.address()).collect();
    let mut setup = Setup::new().server("shards", "2");
    let models = if with_o { &ALL[..] } else { &MODELS[..] };
    for model in models {
        setup = setup.model(model, &addresses).model_key("routing", "round-robin");
    }
    setup
}

fn reload(router: &Router) {
    let response =
        client::exchange(router.admin, &client::request("POST", "/admin/reload", &[], b""));
    assert_eq!(response.status, 200, "{}", response.text());
}

/// Clients sending requests to [`MODELS`] in turn, four connections' worth, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    refused: Arc<Mutex<Vec<(u16, String)>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(router: &Router) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..4)
            .map(|k| {
                let (stop, answered, refused) = (stop.clone(), answered.clone(), refused.clone());
                let addr = router.addr;
                std::thread::spawn(move || {
                    let mut sent = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let model = MODELS[(k + sent) % MODELS.len()];
                        let response = client::exchange(addr, &chat_request(model, None, false));
                        if response.status == 200 {
                            answered.fetch_add(1, Ordering::Relaxed);
                        } else {
                            refused.lock().unwrap().push((response.status, response.text()));
                        }
                        sent += 1;
                    }
                })
            })
            .collect();
        Load { stop, answered, refused, threads }
    }

    /// Stops the clients; the requests answered 200 (panics if any was answered otherwise).
    fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().unwrap();
        }
        let refused = self.refused.lock().unwrap();
        assert!(refused.is_empty(), "answered with an error during reloads: {refused:?}");
        self.answered.load(Ordering::Relaxed)
    }
}

/// Settled on `a` and `b` after `c` was removed: each model's scheduler has all three in its
/// table, `c` not live, and new requests to each model go to `a` and `b` in turn.
fn assert_settled(router: &Router, backends: &[Backend; 3]) {
    let queue = client::debug_queue(router.admin);
    let entries = queue["models"].as_array().unwrap();
    assert_eq!(entries.len(), 3, "{queue}");
    for (model, entry) in ALL.iter().zip(entries) {
        assert_eq!(entry["model"], *model);
        let live: Vec<bool> = (entry["backends"].as_array().unwrap().iter())
            .map(|backend| backend["live"].as_bool().unwrap())
            .collect();
        assert_eq!(live, [true, true, false], "model {model}'s scheduler: {entry}");
    }
    let before: Vec<usize> = backends.iter().map(Backend::request_count).collect();
    for model in ALL {
        for _ in 0..4 {
            let response = client::exchange(router.addr, &chat_request(model, None, false));
            assert_eq!(response.status, 200, "{}", response.text());
        }
    }
    let after: Vec<usize> = backends.iter().map(Backend::request_count).collect();
    assert_eq!(after[2], before[2], "no new request reaches the removed backend");
    assert_eq!(after[0] - before[0] + after[1] - before[1], 12);
    assert!(after[0] > before[0] && after[1] > before[1], "a and b both serve: {after:?}");
}

#[test]
fn reloads_under_traffic_lose_nothing_and_end_on_the_last_backends() {
    let backends = [Backend::start(), Backend::start(), Backend::start()];
    let [a, b, c] = &backends;
    let path = support::temp_path("reload-under-load", "config.toml");
    let router = setup(&[a], false).start_from_file(&path);
    let load = Load::start(&router);

    // Every set adds or removes at least one backend; `o` first comes with a, b and c (its
    // table's order); the last set leaves c out.
    let sets: [(&[&Backend], bool); 6] = [
        (&[a, b], false),
        (&[b, c], false),
        (&[a, b, c], true),
        (&[c], true),
        (&[a, c], false),
        (&[a, b], true),
    ];
    for round in 0..5 {
        for (set, with_o) in sets {
            std::fs::write(&path, setup(set, with_o).toml()).unwrap();
            reload(&router);
            // A few requests between reloads, and now and then reloads back to back.
            if round % 2 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
    }
    let answered = load.stop();
    assert!(answered > 0, "the clients sent requests");
    let reached: usize = backends.iter().map(Backend::request_count).sum();
    assert_eq!(reached, answered, "each answered request reached exactly one backend");
    assert_settled(&router, &backends);
    for model in ALL {
        client::wait_idle(router.admin, model);
    }
}
