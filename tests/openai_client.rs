//! A real OpenAI client through the router: `tests/openai_client.py` (the official `openai`
//! Python package) sends a model list, a non-streaming and a streaming chat completion with a
//! session header, and an unknown model, to warmpath in front of a fake backend.
//!
//! Needs `python3` with `openai` (`pip install openai`). Without it the test fails and says
//! so, unless `WARMPATH_SKIP_OPENAI=1`, which turns it into a printed skip.

mod support;

use std::path::Path;
use std::process::Command;

use support::backend::{Backend, DEFAULT_CONTENT};
use support::router::Setup;

/// The script's exit status when `import openai` fails.
const NO_OPENAI: i32 = 3;

#[test]
fn the_openai_python_client_talks_to_warmpath() {
    let backend = Backend::start();
    let router = Setup::new().model("m", &[backend.address()]).start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    // One Python start (importing openai takes about two seconds): the script itself reports
    // a missing package.
    let output = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}", router.addr))
        .arg(DEFAULT_CONTENT)
        .output();
    let missing = match &output {
        Ok(output) => output.status.code() == Some(NO_OPENAI),
        Err(_) => true,
    };
    if missing {
        if std::env::var("WARMPATH_SKIP_OPENAI").as_deref() == Ok("1") {
            println!(
                "skipped: python3 with the openai package is missing (WARMPATH_SKIP_OPENAI=1)"
            );
            return;
        }
        panic!(
            "python3 cannot import the openai package: run `pip install openai` \
             (or set WARMPATH_SKIP_OPENAI=1 to skip this test); {output:?}"
        );
    }
    let output = output.expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");

    let requests = backend.requests();
    assert_eq!(requests.len(), 2, "two chat completions reached the backend: {requests:?}");
    for (request, stream) in requests.iter().zip([false, true]) {
        assert_eq!(
            (request.method.as_str(), request.target.as_str()),
            ("POST", "/v1/chat/completions")
        );
        assert_eq!(request.session.as_deref(), Some("py-session-1"));
        let json = request.json();
        assert_eq!(json["model"], "m");
        assert_eq!(json["stream"].as_bool().unwrap_or(false), stream, "{json}");
    }
}
