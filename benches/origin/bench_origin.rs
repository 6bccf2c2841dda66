//! A fast local origin for `benches/e2e.sh`: an HTTP/1.1 keep-alive server on one
//! current-thread runtime that answers every request with the same body.
//!
//! ```text
//! bench_origin [--listen 127.0.0.1:0] [--body-size 5] [--address-file FILE]
//! ```
//!
//! It binds loopback only (the address must be a loopback one), prints the bound address on
//! stdout and, with `--address-file`, writes it to FILE (via a rename, so a reader polling the
//! file never sees half of it). The body is built once and shared, so a response costs the
//! origin only hyper's own work: the point is to keep the shared client core free for the load
//! generator, not to measure this server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

struct Args {
    listen: SocketAddr,
    body_size: usize,
    address_file: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        body_size: 5,
        address_file: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?,
            "--body-size" => {
                args.body_size = value()?.parse().map_err(|e| format!("--body-size: {e}"))?
            }
            "--address-file" => args.address_file = Some(PathBuf::from(value()?)),
            "-h" | "--help" => return Err(
                "usage: bench_origin [--listen 127.0.0.1:0] [--body-size N] [--address-file FILE]"
                    .to_owned(),
            ),
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    // The bench must never serve (or be reachable) beyond this machine.
    if !args.listen.ip().is_loopback() {
        return Err(format!("--listen {}: only loopback addresses", args.listen));
    }
    Ok(args)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_origin: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(serve(args)) {
        eprintln!("bench_origin: {e}");
        std::process::exit(1);
    }
}

async fn serve(args: Args) -> std::io::Result<()> {
    let listener = TcpListener::bind(args.listen).await?;
    let bound = listener.local_addr()?;
    println!("{bound}");
    if let Some(path) = &args.address_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bound.to_string())?;
        std::fs::rename(&tmp, path)?;
    }
    // A recognisable, printable body of exactly the requested size.
    let body = Bytes::from(
        b"hello"
            .iter()
            .copied()
            .cycle()
            .take(args.body_size)
            .collect::<Vec<u8>>(),
    );
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            // Running out of file descriptors or a connection reset before accept: keep serving.
            Err(e) => {
                eprintln!("bench_origin: accept: {e}");
                continue;
            }
        };
        // Responses are small; do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let service = service_fn(move |_req: Request<hyper::body::Incoming>| {
                let body = body.clone();
                async move {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "text/plain")
                            .body(Full::new(body))
                            .expect("static response"),
                    )
                }
            });
            // Keep-alive is hyper's default; errors are clients going away, which is normal here.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
