//! A flood of distinct names through egressd, and what it does to egressd's memory
//! (`benches/dns_flood.sh`; docs/operations.md "Limits and hardening").
//!
//! ```text
//! dns_flood --egressd target/release/egressd [--names 100000] [--conns 8]
//!           [--mode wildcard|undeclared] [--lookups-per-second N] [--ttl 300]
//! ```
//!
//! Starts, all on 127.0.0.1 ports the kernel picks: a DNS server answering every name under
//! `w.test` (`u.test` in undeclared mode) with 127.0.0.1 (A; AAAA: no record), an HTTP/1.1
//! keep-alive origin, and egressd (`--workers 1`) with a wildcard Backend `*.w.test` on the
//! origin's port (or `outboundPolicy: AllowAny` with loopback allowed). Then sends one request
//! for each of `--names` distinct names (`h0.w.test`, `h1.w.test`, …) over `--conns` keep-alive
//! connections, and prints egressd's RSS before, right after and 10 s after the flood, its
//! peak, the replies by status, the DNS queries egressd made, and its `egressd_dns_refreshers`.
//! `--lookups-per-second` sets `dns.maxLookupsPerSecond` (default: egressd's, 100).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

struct Args {
    egressd: PathBuf,
    names: usize,
    conns: usize,
    undeclared: bool,
    lookups_per_second: Option<u32>,
    ttl: u32,
}

fn args() -> Args {
    let mut args = Args {
        egressd: PathBuf::from("target/release/egressd"),
        names: 100_000,
        conns: 8,
        undeclared: false,
        lookups_per_second: None,
        ttl: 300,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let number = || value.parse::<usize>().expect("a number");
        match flag.as_str() {
            "--egressd" => args.egressd = PathBuf::from(&value),
            "--names" => args.names = number(),
            "--conns" => args.conns = number().max(1),
            "--mode" => args.undeclared = value == "undeclared",
            "--lookups-per-second" => args.lookups_per_second = Some(number() as u32),
            "--ttl" => args.ttl = number() as u32,
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let queries = Arc::new(AtomicUsize::new(0));
    let dns = UdpSocket::bind("127.0.0.1:0").await.expect("bind DNS");
    let dns_addr = dns.local_addr().expect("DNS address");
    tokio::spawn(serve_dns(dns, args.ttl, queries.clone()));
    let origin = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let origin_port = origin.local_addr().expect("origin address").port();
    tokio::spawn(serve_origin(origin));

    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("egressd.yaml"),
        config(&args, dns_addr, origin_port),
    )
    .expect("write config");
    let mut egressd = Egressd::start(&args.egressd, dir.path()).await;
    let listener = egressd.listener().await;
    let domain = if args.undeclared { "u.test" } else { "w.test" };
    let before = egressd.rss_kib();
    println!(
        "egressd {} names under {domain}, {} connections; RSS before: {} KiB",
        args.names, args.conns, before
    );

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let statuses = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let mut clients = Vec::new();
    for _ in 0..args.conns {
        let (next, statuses) = (next.clone(), statuses.clone());
        let total = args.names;
        clients.push(tokio::spawn(async move {
            let mut conn = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return;
                }
                let host = format!("h{i}.{domain}:{origin_port}");
                let status = request(&mut conn, listener, &host, "/").await.0;
                *statuses.lock().unwrap().entry(status).or_insert(0usize) += 1;
            }
        }));
    }
    for client in clients {
        client.await.expect("client");
    }
    let took = started.elapsed();
    let after = egressd.rss_kib();
    let refreshers = egressd.metric("egressd_dns_refreshers").await;
    println!(
        "flood took {took:.1?} ({:.0} names/s); replies by status: {:?}",
        args.names as f64 / took.as_secs_f64(),
        statuses.lock().unwrap()
    );
    println!(
        "DNS queries egressd made: {}; right after: RSS {after} KiB, peak {} KiB, {refreshers} DNS refreshers",
        queries.load(Ordering::Relaxed),
        egressd.peak_rss_kib()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    println!(
        "10 s after: RSS {} KiB, {} DNS refreshers",
        egressd.rss_kib(),
        egressd.metric("egressd_dns_refreshers").await
    );
    egressd.stop();
}

/// The config: a wildcard Backend for `*.w.test` on the origin's port, or `AllowAny`.
fn config(args: &Args, dns: SocketAddr, origin_port: u16) -> String {
    let rate = args
        .lookups_per_second
        .map_or(String::new(), |n| format!("\n    maxLookupsPerSecond: {n}"));
    let undeclared = if args.undeclared {
        "\n  outboundPolicy: AllowAny\n  undeclaredDestinations: {allowedAddresses: [127.0.0.0/8]}"
    } else {
        ""
    };
    let mut yaml = format!(
        "apiVersion: egressd.dev/v1alpha1\nkind: ProxyConfig\nmetadata: {{name: egressd}}\nspec:\n  accessLog: {{enabled: false}}\n  dns:\n    nameservers: [\"{dns}\"]{rate}{undeclared}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: gw}}\nspec:\n  listeners:\n  - {{name: http, address: 127.0.0.1, port: 0, protocol: HTTP}}\n"
    );
    if !args.undeclared {
        yaml += &format!("---\napiVersion: egressd.dev/v1alpha1\nkind: Backend\nmetadata: {{name: w}}\nspec:\n  destination:\n    type: FQDN\n    fqdn: {{hostname: \"*.w.test\", allowedAddresses: [127.0.0.0/8]}}\n    ports: [{{number: {origin_port}}}]\n  tls: {{mode: InsecureDisable}}\n");
    }
    yaml
}

/// Answers A queries for every name with 127.0.0.1, AAAA queries with no record.
async fn serve_dns(socket: UdpSocket, ttl: u32, queries: Arc<AtomicUsize>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((len, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(request) = Message::from_vec(&buf[..len]) else {
            continue;
        };
        queries.fetch_add(1, Ordering::Relaxed);
        let Some(query) = request.query().cloned() else {
            continue;
        };
        let mut response = Message::new();
        response
            .set_id(request.id())
            .set_message_type(MessageType::Response)
            .set_op_code(request.op_code())
            .set_recursion_desired(request.recursion_desired())
            .set_recursion_available(true)
            .set_response_code(ResponseCode::NoError);
        response.add_query(query.clone());
        if query.query_type() == RecordType::A {
            let rdata = RData::A(A(Ipv4Addr::LOCALHOST));
            response.add_answer(Record::from_rdata(query.name().clone(), ttl, rdata));
        } else {
            let soa = SOA::new(
                Name::from_ascii("ns.test.").expect("name"),
                Name::from_ascii("hostmaster.test.").expect("name"),
                1,
                60,
                60,
                60,
                60,
            );
            response.add_name_server(Record::from_rdata(Name::root(), 60, RData::SOA(soa)));
        }
        if let Ok(bytes) = response.to_vec() {
            let _ = socket.send_to(&bytes, peer).await;
        }
    }
}

/// HTTP/1.1 keep-alive: 200 `ok` to every request (bodies are not expected).
async fn serve_origin(listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut read = BufReader::new(read);
            let mut line = String::new();
            loop {
                line.clear();
                match read.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) if line == "\r\n" => {
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if write.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                }
            }
        });
    }
}

/// One GET over `conn` (opened, or opened again when the server closed it): the status and
/// the body.
async fn request(
    conn: &mut Option<BufReader<TcpStream>>,
    addr: SocketAddr,
    host: &str,
    path: &str,
) -> (u16, String) {
    for _ in 0..3 {
        if conn.is_none() {
            let stream = TcpStream::connect(addr).await.expect("connect to egressd");
            *conn = Some(BufReader::new(stream));
        }
        let Some(stream) = conn.as_mut() else {
            continue;
        };
        let head = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        if stream.get_mut().write_all(head.as_bytes()).await.is_ok() {
            if let Some(reply) = read_response(stream).await {
                if reply.2 {
                    *conn = None;
                }
                return (reply.0, reply.1);
            }
        }
        *conn = None;
    }
    panic!("no response for {host}");
}

/// Status, body, and whether the server closes the connection after it.
async fn read_response(stream: &mut BufReader<TcpStream>) -> Option<(u16, String, bool)> {
    let mut line = String::new();
    stream.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let (mut length, mut close) = (0usize, false);
    loop {
        line.clear();
        stream.read_line(&mut line).await.ok().filter(|n| *n > 0)?;
        if line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        } else if lower.starts_with("connection:") && lower.contains("close") {
            close = true;
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some((status, String::from_utf8_lossy(&body).into_owned(), close))
}

/// The egressd process.
struct Egressd {
    child: Child,
    admin: SocketAddr,
    _scratch: tempfile::TempDir,
}

impl Egressd {
    async fn start(binary: &PathBuf, config: &std::path::Path) -> Egressd {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let address_file = scratch.path().join("admin-address");
        let child = Command::new(binary)
            .arg("run")
            .arg("--config")
            .arg(config)
            .args(["--workers", "1", "--admin-address", "127.0.0.1:0"])
            .arg("--admin-address-file")
            .arg(&address_file)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn egressd");
        let deadline = Instant::now() + Duration::from_secs(30);
        let admin = loop {
            if let Ok(text) = std::fs::read_to_string(&address_file) {
                break text.trim().parse().expect("admin address");
            }
            assert!(Instant::now() < deadline, "egressd did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let egressd = Egressd {
            child,
            admin,
            _scratch: scratch,
        };
        while egressd.admin_get("/ready").await.0 != 200 {
            assert!(Instant::now() < deadline, "egressd not ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        egressd
    }

    async fn admin_get(&self, path: &str) -> (u16, String) {
        let mut conn = None;
        request(&mut conn, self.admin, "localhost", path).await
    }

    /// The HTTP listener's address, from `/status`.
    async fn listener(&self) -> SocketAddr {
        let status: serde_json::Value =
            serde_json::from_str(&self.admin_get("/status").await.1).expect("/status JSON");
        status["listeners"]
            .as_array()
            .and_then(|l| l.iter().find(|l| l["name"] == "default/gw/http"))
            .and_then(|l| l["address"].as_str())
            .and_then(|a| a.parse().ok())
            .expect("the listener in /status")
    }

    async fn metric(&self, name: &str) -> String {
        let text = self.admin_get("/metrics").await.1;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or("?")
            .to_owned()
    }

    fn proc_status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("/proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("field of /proc/PID/status")
    }

    fn rss_kib(&self) -> u64 {
        self.proc_status("VmRSS:")
    }

    fn peak_rss_kib(&self) -> u64 {
        self.proc_status("VmHWM:")
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
