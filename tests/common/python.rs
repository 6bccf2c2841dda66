//! The official MCP Python SDK's reference server, for interop tests. The SDK is installed once
//! into `target/tmp/mcp-python/` (a venv, pinned versions, from PyPI) by the first test that
//! needs it; later runs reuse it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// What the MCP venv holds: changing it makes a new venv.
const PACKAGES: [&str; 2] = ["mcp==2.3.0", "uvicorn==0.54.0"];

/// The MCP venv's `python`, installed on first use (a panic says why it could not be).
pub(crate) fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| venv("mcp-python", &PACKAGES)).clone()
}

/// The `python` of venv `name` under `target/tmp/` holding `packages` (pinned, from PyPI),
/// made on first use and again when `packages` change.
#[allow(dead_code)] // not every test binary that includes `common` makes a venv
pub(crate) fn venv(name: &str, packages: &[&str]) -> PathBuf {
    // The tests of one binary run at once: two of them making the same venv would remove and
    // create it under each other ("File exists"). One at a time; the second finds it made.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let stamp = packages.join(" ");
    let venv = root.join("venv");
    let python = venv.join("bin/python");
    let marker = root.join("installed");
    if std::fs::read_to_string(&marker).is_ok_and(|s| s == stamp) {
        return python;
    }
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("create target/tmp/{name}: {e}"));
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    );
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages),
        &format!("pip install {stamp}"),
    );
    std::fs::write(&marker, stamp).expect("write the install marker");
    python
}

/// `tests/fixtures/python/mcp_reference_server.py`: the SDK's server with an event store, on
/// 127.0.0.1 (ephemeral port), stopped when dropped.
pub(crate) struct PythonMcpServer {
    pub(crate) addr: SocketAddr,
    child: Child,
}

impl PythonMcpServer {
    pub(crate) async fn start() -> PythonMcpServer {
        let python = python();
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/python/mcp_reference_server.py");
        tokio::task::spawn_blocking(move || {
            let mut child = Command::new(python)
                .arg(script)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the Python MCP server");
            // The script prints its port once it is listening.
            let mut line = String::new();
            BufReader::new(child.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("read the server's port");
            let port: u16 = line
                .trim()
                .strip_prefix("PORT ")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("the Python MCP server said {line:?}"));
            PythonMcpServer {
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                child,
            }
        })
        .await
        .expect("start the Python MCP server")
    }

    /// (open sessions, initializes, DELETEs seen).
    pub(crate) async fn stats(&self) -> (u64, u64, u64) {
        let stats = super::proxy::get(self.addr, "127.0.0.1", "/stats").await;
        let v: serde_json::Value = serde_json::from_str(&stats.text()).expect("stats JSON");
        (
            v["sessions"].as_u64().expect("sessions"),
            v["initializes"].as_u64().expect("initializes"),
            v["deletes"].as_u64().expect("deletes"),
        )
    }
}

impl Drop for PythonMcpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
