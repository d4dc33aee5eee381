//! One read from a kine, to tell a kine that answers from one that only accepts connections (a
//! stopped or wedged kine still completes TCP handshakes: the kernel queues them).
//!
//! The read is what kcp's own etcd health check does: a Range of `/registry/health`, which kine
//! keeps (kine `pkg/server/types.go:26`, created by `pkg/logstructured/logstructured.go:42`), so it
//! goes through kine to its SQL database. It is one unary gRPC call: an HTTP/2 POST (prior
//! knowledge, kine's listener is plain) of one length-prefixed protobuf message. That is all of
//! gRPC and protobuf kcpshard needs, so it is written here rather than pulling in a gRPC stack and
//! code generation for it.
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpStream, UnixStream};

use super::kine::KineAddress;

/// The key kcp's etcd health check reads.
const HEALTH_KEY: &[u8] = b"/registry/health";

/// `etcdserverpb.RangeRequest { key: HEALTH_KEY }` as a gRPC message: a 5-byte prefix
/// (uncompressed, big-endian length) and the protobuf encoding of field 1 (bytes, wire type 2).
fn range_request() -> Bytes {
    let mut message = vec![0x0a, HEALTH_KEY.len() as u8];
    message.extend_from_slice(HEALTH_KEY);
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// Reads `/registry/health` from the kine at `address`: Ok(None) when the read succeeded,
/// Ok(Some(why)) when kine answered with an error (its database is away: kine itself answers), Err
/// when kine did not answer. The caller bounds the time.
pub async fn read_health(address: &KineAddress) -> Result<Option<String>, String> {
    let connect = |e: std::io::Error| format!("cannot connect: {e}");
    match address {
        KineAddress::Unix(path) => range(UnixStream::connect(path).await.map_err(connect)?).await,
        KineAddress::Tcp(port) => range(TcpStream::connect(("127.0.0.1", *port)).await.map_err(connect)?).await,
    }
}

/// The Range of [`read_health`] over a connection to kine.
async fn range<S>(stream: S) -> Result<Option<String>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
    let connection = tokio::spawn(connection);
    let request = Request::post("http://kine/etcdserverpb.KV/Range")
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(Full::new(range_request()))
        .expect("a valid request");
    let outcome = async {
        let response = sender.send_request(request).await.map_err(|e| format!("Range: {e}"))?;
        if response.status() != StatusCode::OK {
            return Err(format!("Range: HTTP {}", response.status()));
        }
        // A failed call may carry its status in the headers alone ("trailers-only").
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("Range: reading the answer: {e}"))?;
        let trailers = body.trailers().cloned().unwrap_or_default();
        let field = |name: &str| {
            trailers
                .get(name)
                .or_else(|| headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        match field("grpc-status").as_deref() {
            Some("0") => Ok(None),
            Some(code) => Ok(Some(format!(
                "Range: gRPC status {code}: {}",
                field("grpc-message").unwrap_or_default()
            ))),
            None => Err("Range: no gRPC status in the answer".into()),
        }
    }
    .await;
    connection.abort();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_request_is_one_length_prefixed_message_with_the_key() {
        let framed = range_request();
        assert_eq!(framed[0], 0, "not compressed");
        let len = u32::from_be_bytes(framed[1..5].try_into().unwrap()) as usize;
        assert_eq!(len, framed.len() - 5);
        assert_eq!(&framed[5..7], &[0x0a, 16]);
        assert_eq!(&framed[7..], b"/registry/health");
    }

    #[tokio::test]
    async fn a_socket_that_does_not_speak_http2_is_a_failed_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kine.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            use tokio::io::AsyncWriteExt;
            let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        });
        assert!(read_health(&KineAddress::Unix(path)).await.is_err());
        assert!(
            read_health(&KineAddress::Tcp(1))
                .await
                .unwrap_err()
                .contains("cannot connect")
        );
    }
}
