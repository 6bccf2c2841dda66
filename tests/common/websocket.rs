//! A websocket echo server (tokio-tungstenite, HTTP/1.1 handshake) on 127.0.0.1:0 that records
//! each handshake request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};

/// Echoes every data message; pings are answered and closes echoed by tungstenite itself.
/// Offered a `Sec-WebSocket-Protocol`, it picks the first one.
pub(crate) struct EchoServer {
    pub(crate) addr: SocketAddr,
    handshakes: Arc<Mutex<Vec<http::Request<()>>>>,
    accept: JoinHandle<()>,
}

impl EchoServer {
    pub(crate) async fn start() -> EchoServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes: Arc<Mutex<Vec<http::Request<()>>>> = Arc::default();
        let recorded = handshakes.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let recorded = recorded.clone();
                tokio::spawn(async move {
                    // The error type is tungstenite's (`Callback`), not ours to make smaller.
                    #[allow(clippy::result_large_err)]
                    let callback = |request: &Request, mut response: Response| {
                        let offered = request
                            .headers()
                            .get("sec-websocket-protocol")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.split(',').next())
                            .map(|p| p.trim().to_owned());
                        if let Some(protocol) = offered {
                            response.headers_mut().insert(
                                "sec-websocket-protocol",
                                protocol.parse().expect("header value"),
                            );
                        }
                        let mut copy = http::Request::new(());
                        *copy.uri_mut() = request.uri().clone();
                        *copy.headers_mut() = request.headers().clone();
                        recorded.lock().unwrap().push(copy);
                        Ok(response)
                    };
                    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, callback).await
                    else {
                        return;
                    };
                    while let Some(Ok(message)) = ws.next().await {
                        if (message.is_text() || message.is_binary())
                            && ws.send(message).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        EchoServer {
            addr,
            handshakes,
            accept,
        }
    }

    /// The handshake requests received so far (URI and headers).
    pub(crate) fn handshakes(&self) -> Vec<http::Request<()>> {
        self.handshakes
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                let mut copy = http::Request::new(());
                *copy.uri_mut() = r.uri().clone();
                *copy.headers_mut() = r.headers().clone();
                copy
            })
            .collect()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        // Closes the listener; open websockets end with the test's runtime.
        self.accept.abort();
    }
}

/// Through an echo server: a text message, a 16 MiB binary message (both ways), a ping
/// answered by a pong, and close code 4001 with its reason echoed back.
pub(crate) async fn echo_text_binary_ping_and_close<S>(
    ws: &mut tokio_tungstenite::WebSocketStream<S>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::Message;

    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));

    let big: Vec<u8> = (0..16 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    ws.send(Message::binary(big.clone())).await.unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Binary(data) => assert!(data[..] == big[..], "16 MiB echoed intact"),
        other => panic!("expected binary, got {other:?}"),
    }

    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    assert_eq!(
        ws.next().await.unwrap().unwrap(),
        Message::Pong(b"are you there".to_vec().into())
    );

    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Library(4001),
        reason: "bye".into(),
    })))
    .await
    .unwrap();
    match ws.next().await.unwrap().unwrap() {
        Message::Close(Some(frame)) => {
            assert_eq!(frame.code, CloseCode::Library(4001));
            assert_eq!(frame.reason.as_str(), "bye");
        }
        other => panic!("expected the close echoed, got {other:?}"),
    }
}
