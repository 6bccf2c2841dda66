//! Ports held by the tests with bound sockets, so nothing else on the machine takes them
//! between being chosen and being used (a port bound and released, then bound again, is a
//! race): [`shared_port`], one port on several 127.0.0.x addresses for servers to listen on
//! through [`listen`], and [`Refusing`], an address that refuses connections.
//!
//! A socket bound but not listening holds its address (no `SO_REUSEADDR`: no other socket
//! can bind it), and connecting to it is refused, as to a port nothing uses.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Mutex;

use socket2::{Domain, Socket, Type};

/// [`shared_port`] holds its port on 127.0.0.1 to 127.0.0.`SHARED_HOSTS`.
pub(crate) const SHARED_HOSTS: u8 = 6;

/// Sockets bound by [`shared_port`], until [`listen`] takes them.
static HELD: Mutex<Vec<(SocketAddr, Socket)>> = Mutex::new(Vec::new());

/// 127.0.0.`n`:`port`.
pub(crate) fn loopback(n: u8, port: u16) -> SocketAddr {
    SocketAddr::new(Ipv4Addr::new(127, 0, 0, n).into(), port)
}

/// A TCP socket bound to `addr`, not listening.
fn bound(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// A port bound on 127.0.0.1 to 127.0.0.[`SHARED_HOSTS`] at once (several upstreams of one
/// Backend, whose endpoints share the port), held by this process until a server takes its
/// address with [`listen`]; until then, and for good on an address no server takes,
/// connecting there is refused.
pub(crate) fn shared_port() -> u16 {
    for _ in 0..100 {
        let first = bound(loopback(1, 0)).expect("bind 127.0.0.1:0");
        let port = first
            .local_addr()
            .expect("local addr")
            .as_socket()
            .expect("an IP address")
            .port();
        let mut held = vec![(loopback(1, port), first)];
        for n in 2..=SHARED_HOSTS {
            match bound(loopback(n, port)) {
                Ok(socket) => held.push((loopback(n, port), socket)),
                // Taken on that address by someone else: try another port.
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => break,
                Err(e) => panic!("bind {}: {e}", loopback(n, port)),
            }
        }
        if held.len() == usize::from(SHARED_HOSTS) {
            HELD.lock().unwrap().extend(held);
            return port;
        }
    }
    panic!("no port free on all of 127.0.0.1 to 127.0.0.{SHARED_HOSTS} in 100 tries")
}

/// A listener on `addr`: the socket [`shared_port`] holds there, now listening (with
/// `SO_REUSEADDR`, like any other), or else a new one bound to `addr`.
pub(crate) async fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let held = {
        let mut held = HELD.lock().unwrap();
        let found = held.iter().position(|(a, _)| *a == addr);
        found.map(|i| held.swap_remove(i).1)
    };
    match held {
        Some(socket) => {
            // As `TcpListener::bind` does: the connections it accepts inherit the flag, so a
            // server started again on `addr` once this one is gone can bind while they close.
            socket.set_reuse_address(true)?;
            socket.listen(1024)?;
            socket.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(socket.into())
        }
        None => tokio::net::TcpListener::bind(addr).await,
    }
}

/// An address on 127.0.0.1 where connecting is refused for as long as this lives: a socket
/// bound there, never listening.
pub(crate) struct Refusing {
    pub(crate) addr: SocketAddr,
    _socket: Socket,
}

impl Refusing {
    pub(crate) fn bind() -> Refusing {
        let socket = bound(loopback(1, 0)).expect("bind 127.0.0.1:0");
        let addr = socket
            .local_addr()
            .expect("local addr")
            .as_socket()
            .expect("an IP address");
        Refusing {
            addr,
            _socket: socket,
        }
    }
}
