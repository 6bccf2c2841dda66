//! A real DNS server over UDP and TCP on one 127.0.0.1 port the kernel picks, answering from a
//! table the test changes while egressd runs. egressd is pointed at it with
//! `ProxyConfig.spec.dns.nameservers`.
//!
//! Names are matched case-insensitively without the trailing dot. Known names get their A
//! and AAAA records, and an empty NOERROR answer for a type they have none of (so an
//! IPv4-and-IPv6 lookup succeeds with what there is); unknown names get NXDOMAIN; `set_failing(true)` turns every answer into
//! SERVFAIL. An answer over 512 bytes is sent over UDP truncated (TC, no records), as real
//! servers do, and whole over TCP, where the resolver asks again: thousands of records fit.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

#[derive(Default)]
struct Table {
    records: HashMap<String, (Vec<IpAddr>, u32)>,
    failing: bool,
    /// A queries seen per name (one per lookup; AAAA queries are not counted).
    queries: HashMap<String, usize>,
}

/// The DNS server; dropping it stops it.
pub(crate) struct TestDns {
    pub(crate) addr: SocketAddr,
    table: Arc<Mutex<Table>>,
    tasks: [JoinHandle<()>; 2],
}

/// What fits a UDP answer without EDNS (RFC 1035 §4.2.1).
const UDP_ANSWER_MAX: usize = 512;

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl TestDns {
    pub(crate) async fn start() -> TestDns {
        // The UDP port the kernel picks, and TCP on the same number (another tries again).
        let (socket, listener) = loop {
            let socket = UdpSocket::bind("127.0.0.1:0")
                .await
                .expect("bind DNS socket");
            let addr = socket.local_addr().expect("DNS local addr");
            if let Ok(listener) = TcpListener::bind(addr).await {
                break (socket, listener);
            }
        };
        let addr = socket.local_addr().expect("DNS local addr");
        let table = Arc::new(Mutex::new(Table::default()));
        let tasks = [
            tokio::spawn(serve(socket, table.clone())),
            tokio::spawn(serve_tcp(listener, table.clone())),
        ];
        TestDns { addr, table, tasks }
    }

    /// Answers A queries for `name` with `ips`, each with `ttl_secs`.
    pub(crate) fn set(&self, name: &str, ips: &[Ipv4Addr], ttl_secs: u32) {
        let ips: Vec<IpAddr> = ips.iter().map(|ip| IpAddr::V4(*ip)).collect();
        self.set_ips(name, &ips, ttl_secs);
    }

    /// Answers A queries for `name` with the IPv4 addresses of `ips` and AAAA queries with the
    /// IPv6 ones, each with `ttl_secs`.
    pub(crate) fn set_ips(&self, name: &str, ips: &[IpAddr], ttl_secs: u32) {
        self.table
            .lock()
            .unwrap()
            .records
            .insert(key(name), (ips.to_vec(), ttl_secs));
    }

    /// Forgets `name`: queries for it get NXDOMAIN.
    pub(crate) fn remove(&self, name: &str) {
        self.table.lock().unwrap().records.remove(&key(name));
    }

    /// While true, every query gets SERVFAIL.
    pub(crate) fn set_failing(&self, failing: bool) {
        self.table.lock().unwrap().failing = failing;
    }

    /// A queries received for `name` so far (over UDP and TCP: a truncated answer's name
    /// counts twice).
    pub(crate) fn query_count(&self, name: &str) -> usize {
        let table = self.table.lock().unwrap();
        table.queries.get(&key(name)).copied().unwrap_or(0)
    }

    /// Names asked for so far (A queries, over UDP or TCP).
    pub(crate) fn names_asked(&self) -> usize {
        self.table.lock().unwrap().queries.len()
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve(socket: UdpSocket, table: Arc<Mutex<Table>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((len, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(request) = Message::from_vec(&buf[..len]) else {
            continue;
        };
        let mut response = answer(&request, &table);
        let Ok(mut bytes) = response.to_vec() else {
            continue;
        };
        if bytes.len() > UDP_ANSWER_MAX {
            response.take_answers();
            response.take_name_servers();
            response.set_truncated(true);
            let Ok(truncated) = response.to_vec() else {
                continue;
            };
            bytes = truncated;
        }
        let _ = socket.send_to(&bytes, peer).await;
    }
}

async fn serve_tcp(listener: TcpListener, table: Arc<Mutex<Table>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve_connection(stream, table.clone()));
    }
}

/// Messages over TCP, each after its two-byte length (RFC 1035 §4.2.2), until the resolver
/// closes the connection.
async fn serve_connection(mut stream: TcpStream, table: Arc<Mutex<Table>>) {
    loop {
        let Ok(len) = stream.read_u16().await else {
            return;
        };
        let mut buf = vec![0u8; usize::from(len)];
        if stream.read_exact(&mut buf).await.is_err() {
            return;
        }
        let Ok(request) = Message::from_vec(&buf) else {
            return;
        };
        let Ok(bytes) = answer(&request, &table).to_vec() else {
            return;
        };
        let Ok(len) = u16::try_from(bytes.len()) else {
            return;
        };
        if stream.write_u16(len).await.is_err() || stream.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

fn answer(request: &Message, table: &Mutex<Table>) -> Message {
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_authoritative(true);
    let Some(query) = request.query().cloned() else {
        response.set_response_code(ResponseCode::FormErr);
        return response;
    };
    response.add_query(query.clone());

    let mut table = table.lock().unwrap();
    let name = key(&query.name().to_ascii());
    if query.query_type() == RecordType::A {
        *table.queries.entry(name.clone()).or_default() += 1;
    }
    if table.failing {
        response.set_response_code(ResponseCode::ServFail);
        return response;
    }
    match table.records.get(&name) {
        None => {
            // An SOA with a 1s minimum keeps the resolver's negative cache short, so a name the
            // test adds later is found promptly.
            response.set_response_code(ResponseCode::NXDomain);
            response.add_name_server(soa_record());
        }
        Some((ips, ttl)) => {
            response.set_response_code(ResponseCode::NoError);
            let answers: Vec<RData> = ips
                .iter()
                .filter_map(|ip| match (ip, query.query_type()) {
                    (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(*v4))),
                    (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(*v6))),
                    _ => None,
                })
                .collect();
            if answers.is_empty() {
                // NOERROR with no answer ("NODATA") for a type the name has none of.
                response.add_name_server(soa_record());
            }
            for rdata in answers {
                response.add_answer(Record::from_rdata(query.name().clone(), *ttl, rdata));
            }
        }
    }
    response
}

fn soa_record() -> Record {
    let zone = Name::root();
    let soa = SOA::new(
        Name::from_ascii("ns.test.").expect("valid name"),
        Name::from_ascii("hostmaster.test.").expect("valid name"),
        1,
        60,
        60,
        60,
        1,
    );
    Record::from_rdata(zone, 1, RData::SOA(soa))
}
