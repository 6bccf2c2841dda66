//! An in-process egressd started from YAML written to a temp dir, and small HTTP/1.1 client
//! helpers that talk to it over real sockets.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The file the config is written to inside the temp dir.
const CONFIG_FILE: &str = "egressd.yaml";

/// A running in-process proxy. Its config lives in a temp dir removed on drop.
pub(crate) struct TestProxy {
    proxy: Option<egressd::Proxy>,
    dir: tempfile::TempDir,
    pub(crate) admin: SocketAddr,
}

impl TestProxy {
    /// Writes `yaml` to a temp dir and starts egressd on it (one worker, admin on an ephemeral
    /// port, no file watching). Panics unless the config loaded.
    pub(crate) async fn start(yaml: &str) -> TestProxy {
        Self::start_with(yaml, None).await
    }

    /// Like [`TestProxy::start`], with file watching on (a short debounce): changes to the
    /// config and to the files it refers to reload by themselves.
    pub(crate) async fn start_watching(yaml: &str) -> TestProxy {
        let watch = egressd::runtime::watch::WatchOptions {
            debounce: Duration::from_millis(50),
            poll_interval: Some(Duration::from_millis(500)),
        };
        Self::start_with(yaml, Some(watch)).await
    }

    async fn start_with(
        yaml: &str,
        watch: Option<egressd::runtime::watch::WatchOptions>,
    ) -> TestProxy {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(CONFIG_FILE), yaml).expect("write config");
        let options = egressd::Options {
            config: vec![dir.path().to_path_buf()],
            workers: 1,
            admin_address: Some("127.0.0.1:0".parse().unwrap()),
            watch,
        };
        let proxy = egressd::Proxy::start(options)
            .await
            .expect("egressd starts");
        let generation = proxy.shared().snapshot.load().generation;
        assert!(
            generation >= 1,
            "config did not load: {:?}",
            proxy.shared().reload_status().messages
        );
        let admin = proxy.admin_addr().await.expect("admin address");
        TestProxy {
            proxy: Some(proxy),
            dir,
            admin,
        }
    }

    /// The proxy itself, e.g. to inspect the snapshot serving now.
    pub(crate) fn egressd(&self) -> &egressd::Proxy {
        self.proxy()
    }

    fn proxy(&self) -> &egressd::Proxy {
        self.proxy.as_ref().expect("proxy not shut down")
    }

    /// The bound address of listener `namespace/gateway/listener`.
    pub(crate) fn listener(&self, key: &str) -> SocketAddr {
        self.proxy()
            .listener_addr(key)
            .unwrap_or_else(|| panic!("no listener {key}"))
    }

    /// The listener of [`preamble`]: `default/gw/http`.
    pub(crate) fn http(&self) -> SocketAddr {
        self.listener("default/gw/http")
    }

    /// The sample `series` (name and labels as exported) of the proxy's metrics; 0 when not
    /// exported yet. Read in-process, so that it costs no admin connection.
    pub(crate) fn metric(&self, series: &str) -> f64 {
        sample(&self.proxy().shared().metrics.encode(), series)
    }

    /// The generation of the config being served.
    pub(crate) fn generation(&self) -> u64 {
        self.proxy().shared().snapshot.load().generation
    }

    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.path().join(CONFIG_FILE)
    }

    /// Replaces the config file (no reload by itself: watching is off).
    pub(crate) fn rewrite(&self, yaml: &str) {
        std::fs::write(self.config_path(), yaml).expect("rewrite config");
    }

    /// Reloads now, as SIGHUP does, and panics if the new config was rejected.
    pub(crate) async fn reload(&self) -> u64 {
        match self.proxy().reload().await {
            Ok(generation) => generation,
            Err(e) => panic!(
                "reload failed: {e}: {:?}",
                self.proxy().shared().reload_status().messages
            ),
        }
    }

    /// Drains and stops; returns true if every connection finished in time.
    pub(crate) async fn shutdown(mut self) -> bool {
        self.proxy.take().expect("proxy running").shutdown().await
    }
}

/// The common head of a test config: a ProxyConfig (access log off, DNS pointed at `dns` when
/// given) and a Gateway `gw` with an HTTP listener `http` on 127.0.0.1, ephemeral port.
pub(crate) fn preamble(dns: Option<SocketAddr>) -> String {
    preamble_with(dns, "")
}

/// [`preamble`] with `proxy_spec` (YAML lines indented by two spaces, each ending with a
/// newline) added to the ProxyConfig's spec.
pub(crate) fn preamble_with(dns: Option<SocketAddr>, proxy_spec: &str) -> String {
    let dns = match dns {
        Some(addr) => format!("\n  dns:\n    nameservers: [\"{addr}\"]"),
        None => String::new(),
    };
    format!(
        r#"apiVersion: egressd.dev/v1alpha1
kind: ProxyConfig
metadata:
  name: egressd
spec:
  accessLog:
    enabled: false
  drain:
    timeout: 1s{dns}
{proxy_spec}---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: gw
spec:
  listeners:
  - name: http
    address: 127.0.0.1
    port: 0
    protocol: HTTP
"#
    )
}

/// A plaintext Backend `name` with one IP endpoint `addr` (the usual way to reach a test
/// upstream without DNS). `extra` is appended to the spec, indented by two spaces.
pub(crate) fn ip_backend(name: &str, addr: SocketAddr, extra: &str) -> String {
    ip_backend_speaking(name, addr, "HTTP", extra)
}

/// Like [`ip_backend`], speaking `protocol` (e.g. `GRPC`, `H2C`) instead of `HTTP`: `extra`
/// cannot set it, as a second `protocol` key is a duplicate-key error.
pub(crate) fn ip_backend_speaking(
    name: &str,
    addr: SocketAddr,
    protocol: &str,
    extra: &str,
) -> String {
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: {name}
spec:
  destination:
    type: IP
    ip:
      endpoints:
      - address: {ip}
    ports:
    - number: {port}
  protocol: {protocol}
  tls:
    mode: InsecureDisable
{extra}"#,
        ip = addr.ip(),
        port = addr.port(),
    )
}

/// An HTTPRoute `backend` sending every request for `hostname` to Backend `backend`.
pub(crate) fn route_to(hostname: &str, backend: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {backend}}}\nspec:\n  hostnames: [{hostname}]\n  rules: [{{backendRefs: [{{name: {backend}}}]}}]\n"
    )
}

/// A plaintext FQDN Backend `name` for `hostname` on `ports`, which may resolve to loopback
/// (`allowedAddresses: [127.0.0.0/8]`: the test DNS server answers with the addresses of
/// test upstreams). `extra` is appended to the spec.
pub(crate) fn fqdn_backend(name: &str, hostname: &str, ports: &[u16], extra: &str) -> String {
    fqdn_backend_allowing(name, hostname, ports, &["127.0.0.0/8"], extra)
}

/// [`fqdn_backend`] with `allowed` as its `allowedAddresses` (none: the default check).
pub(crate) fn fqdn_backend_allowing(
    name: &str,
    hostname: &str,
    ports: &[u16],
    allowed: &[&str],
    extra: &str,
) -> String {
    let ports: String = ports
        .iter()
        .map(|p| format!("    - number: {p}\n"))
        .collect();
    let allowed = if allowed.is_empty() {
        String::new()
    } else {
        format!("\n      allowedAddresses: [{}]", allowed.join(", "))
    };
    format!(
        r#"---
apiVersion: egressd.dev/v1alpha1
kind: Backend
metadata:
  name: {name}
spec:
  destination:
    type: FQDN
    fqdn:
      hostname: {hostname}{allowed}
    ports:
{ports}  protocol: HTTP
  tls:
    mode: InsecureDisable
{extra}"#
    )
}

/// The admin `/endpoints` entry of Backend `default/{name}` (all its ports: the first).
pub(crate) async fn endpoints_of(proxy: &TestProxy, name: &str) -> serde_json::Value {
    let all: serde_json::Value =
        serde_json::from_slice(&get(proxy.admin, "localhost", "/endpoints").await.body).unwrap();
    let label = format!("default/{name}");
    all["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == label.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no {label} in {all}"))
}

/// Reads a response head byte by byte (what follows belongs to a tunnel or the next
/// response) and returns it.
pub(crate) async fn read_head(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed early");
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// A response read to the end.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: http::StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: Bytes,
}

impl Response {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }

    /// The `x-egressd-error` code of a local reply.
    pub(crate) fn error_code(&self) -> Option<&str> {
        self.header("x-egressd-error")
    }

    /// The `x-upstream` name the test upstream answered with.
    pub(crate) fn upstream(&self) -> Option<&str> {
        self.header("x-upstream")
    }
}

/// Request bodies the client helpers send.
pub(crate) type ClientBody = Full<Bytes>;

/// One client connection to `addr`; requests on it reuse the connection (keep-alive).
pub(crate) struct Conn {
    sender: hyper::client::conn::http1::SendRequest<ClientBody>,
}

impl Conn {
    pub(crate) async fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.expect("connect to proxy");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
        tokio::spawn(async move {
            // Ends with an error when the proxy aborts a response, which some tests provoke.
            let _ = connection.await;
        });
        Conn { sender }
    }

    /// Sends `request` exactly as given (hyper's connection-level client adds no Host and
    /// writes the URI in whatever form it has, so absolute-form reaches the proxy as such),
    /// and returns the response with its body still streaming.
    pub(crate) async fn send(
        &mut self,
        request: http::Request<ClientBody>,
    ) -> Result<http::Response<Incoming>, hyper::Error> {
        self.sender.ready().await?;
        self.sender.send_request(request).await
    }

    /// Sends `request` and reads the whole response.
    pub(crate) async fn fetch(&mut self, request: http::Request<ClientBody>) -> Response {
        let response = self.send(request).await.expect("response from proxy");
        collect(response).await
    }
}

/// Reads a response body to the end; panics when the body ends in an error.
pub(crate) async fn collect(response: http::Response<Incoming>) -> Response {
    let (parts, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .expect("whole response body")
        .to_bytes();
    Response {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Sends `request` on a new connection and reads the whole response.
pub(crate) async fn fetch(addr: SocketAddr, request: http::Request<ClientBody>) -> Response {
    Conn::open(addr).await.fetch(request).await
}

/// An origin-form request builder with `Host: host`.
pub(crate) fn request(method: &str, host: &str, path: &str) -> http::request::Builder {
    http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, host)
}

/// `GET path` with `Host: host`.
pub(crate) async fn get(addr: SocketAddr, host: &str, path: &str) -> Response {
    get_with_headers(addr, host, path, &[]).await
}

/// `GET path` with `Host: host` and extra headers (repeated names are sent as repeated lines).
pub(crate) async fn get_with_headers(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut builder = request("GET", host, path);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    fetch(addr, builder.body(ClientBody::default()).unwrap()).await
}

/// A forward-proxy style request: `GET http://host:port/path HTTP/1.1` sent to the proxy, with
/// the Host header a real client would send alongside it.
pub(crate) async fn get_absolute(addr: SocketAddr, url: &str) -> Response {
    let uri: http::Uri = url.parse().expect("absolute URL");
    let authority = uri.authority().expect("URL with authority").to_string();
    let request = http::Request::builder()
        .uri(uri)
        .header(http::header::HOST, authority)
        .body(ClientBody::default())
        .unwrap();
    fetch(addr, request).await
}

/// The lines of a JSON-lines file (the access log) so far, parsed; each must be one JSON
/// object. A file not written yet has none.
pub(crate) fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The value of `series` in Prometheus text; 0 when absent.
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().expect("numeric sample"))
}

/// Writes `request` as is on a new connection to `addr` and reads until egressd closes: the
/// status line's code and the whole answer as text (for heads no HTTP client would send).
pub(crate) async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write request");
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP response: {text:?}"));
    (status, text)
}

/// The `x-egressd-error` in the head of a raw answer, if any.
pub(crate) fn raw_error_code(text: &str) -> Option<&str> {
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("x-egressd-error")
            .then(|| value.trim())
    })
}
