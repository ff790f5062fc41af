//! A tonic gRPC service over RDMA, between two processes on soft devices: unary calls and
//! a bidirectional stream, each checked; with `--bench`, the unary call rate and latency
//! over RDMA and over TCP, one JSON line each.
//!
//! The service `echo.Echo` has `Unary` (answers `echo: <request>`) and `Bidi` (answers
//! each message of the request stream as it comes). Messages are UTF-8 strings with a
//! codec of a few lines (`Utf8Codec`): no `.proto`, no `protoc` — a prost codec plugs in
//! the same way. The server serves tonic's `Server` on [`Incoming`] (the streams its remem
//! listener accepts); the client's channel connects with [`RdmaConnector`].
//!
//! - `grpc` runs both: it starts itself as the server, runs the client, and exits non-zero
//!   if a check fails.
//! - `grpc server [--device DEV]` prints `listening RDMA_ADDR TCP_ADDR` and serves until its
//!   standard input closes.
//! - `grpc client --connect RDMA_ADDR [--tcp TCP_ADDR] [--device DEV] [--bench N]`.
//!
//! `cargo run -p remem --features tonic --example grpc [-- --bench 20000]`.

use bytes::{Buf, BufMut};
use hyper::http;
use remem::RdmaBuilder;
use remem::stream::hyper::RdmaConnector;
use remem::stream::tonic::Incoming;
use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder, Streaming};
use tonic::{Request, Response, Status};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The longest the example runs.
const LIMIT: Duration = Duration::from_secs(120);

/// Strings as UTF-8 bytes, as a gRPC message.
#[derive(Debug, Clone, Copy, Default)]
struct Utf8Codec;

impl Codec for Utf8Codec {
    type Encode = String;
    type Decode = String;
    type Encoder = Utf8Codec;
    type Decoder = Utf8Codec;
    fn encoder(&mut self) -> Self {
        Utf8Codec
    }
    fn decoder(&mut self) -> Self {
        Utf8Codec
    }
}

impl Encoder for Utf8Codec {
    type Item = String;
    type Error = Status;
    fn encode(&mut self, item: String, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }
}

impl Decoder for Utf8Codec {
    type Item = String;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<String>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| Status::invalid_argument("not UTF-8"))
    }
}

/// The service, routed by path as generated code does.
#[derive(Debug, Clone, Copy)]
struct Echo;

/// `Unary`: `echo: <request>`.
struct UnaryCall;

impl tower_service::Service<Request<String>> for UnaryCall {
    type Response = Response<String>;
    type Error = Status;
    type Future = std::future::Ready<Result<Response<String>, Status>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(format!("echo: {}", req.into_inner()))))
    }
}

/// `Bidi`: each message of the request stream, answered as it comes.
struct BidiCall;

/// The answers to a request stream.
struct Answers(Streaming<String>);

impl futures_core::Stream for Answers {
    type Item = Result<String, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|m| m.map(|r| r.map(|s| format!("echo: {s}"))))
    }
}

impl tower_service::Service<Request<Streaming<String>>> for BidiCall {
    type Response = Response<Answers>;
    type Error = Status;
    type Future = std::future::Ready<Result<Response<Answers>, Status>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Request<Streaming<String>>) -> Self::Future {
        std::future::ready(Ok(Response::new(Answers(req.into_inner()))))
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> tower_service::Service<http::Request<B>> for Echo
where
    B: hyper::body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut grpc = tonic::server::Grpc::new(Utf8Codec);
        match req.uri().path() {
            "/echo.Echo/Unary" => Box::pin(async move { Ok(grpc.unary(UnaryCall, req).await) }),
            "/echo.Echo/Bidi" => Box::pin(async move { Ok(grpc.streaming(BidiCall, req).await) }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// A TCP listener's connections, for the same server over TCP (`--bench`).
struct TcpIncoming(tokio::net::TcpListener);

impl futures_core::Stream for TcpIncoming {
    type Item = std::io::Result<tokio::net::TcpStream>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_accept(cx).map(|r| {
            Some(r.map(|(s, _)| {
                let _ = s.set_nodelay(true);
                s
            }))
        })
    }
}

/// A stream of the given strings.
struct Strings(std::vec::IntoIter<String>);

impl futures_core::Stream for Strings {
    type Item = String;
    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<String>> {
        Poll::Ready(self.0.next())
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn server(args: &[String]) -> Res<()> {
    let device = arg(args, "--device").unwrap_or_else(|| "soft@127.0.0.2:0".into());
    let rdma = RdmaBuilder::new().device(device).build()?;
    let listener = rdma.listen("127.0.0.1:0").await?;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {} {}", listener.local_addr()?, tcp.local_addr()?);
    // Serves until the parent closes our standard input.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read(&mut [0]);
        let _ = stop.send(());
    });
    let stopped = async {
        let _ = stopped.await;
    };
    let over_rdma = tonic::transport::Server::builder().serve_with_incoming_shutdown(
        Echo,
        Incoming::new(listener),
        stopped,
    );
    let over_tcp = tonic::transport::Server::builder().serve_with_incoming(Echo, TcpIncoming(tcp));
    tokio::select! {
        r = over_rdma => r?,
        r = over_tcp => r?,
    }
    Ok(())
}

async fn channel(
    rdma: Option<remem::Rdma>,
    addr: &str,
) -> Res<tonic::client::Grpc<tonic::transport::Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?;
    let channel = match rdma {
        Some(rdma) => {
            endpoint
                .connect_with_connector(RdmaConnector::new(rdma))
                .await?
        }
        None => endpoint.connect().await?,
    };
    Ok(tonic::client::Grpc::new(channel))
}

async fn unary(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    text: String,
) -> Res<String> {
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static("/echo.Echo/Unary");
    Ok(grpc
        .unary(Request::new(text), path, Utf8Codec)
        .await?
        .into_inner())
}

/// Calls per second and the median and 99th percentile latency (µs) of `n` unary calls
/// one after another.
async fn bench(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    n: usize,
) -> Res<(f64, f64, f64)> {
    for i in 0..n / 10 {
        unary(grpc, format!("warm {i}")).await?;
    }
    let mut times = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        unary(grpc, format!("call {i}")).await?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    Ok((rate, times[n / 2], times[n * 99 / 100]))
}

async fn client(args: &[String]) -> Res<()> {
    let device = arg(args, "--device").unwrap_or_else(|| "soft@127.0.0.1:0".into());
    let addr = arg(args, "--connect").ok_or("--connect ADDR")?;
    let rdma = RdmaBuilder::new().device(device).build()?;
    let mut grpc = channel(Some(rdma.clone()), &addr).await?;

    // Unary calls.
    for i in 0..100 {
        let answer = unary(&mut grpc, format!("hello {i}")).await?;
        if answer != format!("echo: hello {i}") {
            return Err(format!("unary {i}: {answer:?}").into());
        }
    }
    let big = "x".repeat(1 << 20);
    if unary(&mut grpc, big.clone()).await? != format!("echo: {big}") {
        return Err("a 1 MiB unary call came back wrong".into());
    }
    println!("checked: 100 unary calls and one of 1 MiB over RDMA");

    // A bidirectional stream.
    let sent: Vec<String> = (0..500).map(|i| format!("message {i}")).collect();
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static("/echo.Echo/Bidi");
    let mut answers = grpc
        .streaming(
            Request::new(Strings(sent.clone().into_iter())),
            path,
            Utf8Codec,
        )
        .await?
        .into_inner();
    let mut got = Vec::new();
    while let Some(a) = answers.message().await? {
        got.push(a);
    }
    let want: Vec<String> = sent.iter().map(|s| format!("echo: {s}")).collect();
    if got != want {
        return Err(format!(
            "the bidirectional stream answered {} messages, not as sent",
            got.len()
        )
        .into());
    }
    println!("checked: a bidirectional stream of 500 messages over RDMA");

    if let Some(n) = arg(args, "--bench") {
        let n: usize = n.parse()?;
        let (rate, median, p99) = bench(&mut grpc, n).await?;
        println!(
            r#"{{"test":"tonic_unary","transport":"RdmaStream","calls":{n},"calls_per_s":{rate:.0},"median_us":{median:.1},"p99_us":{p99:.1}}}"#
        );
        let tcp = arg(args, "--tcp").ok_or("--tcp ADDR")?;
        let mut grpc = channel(None, &tcp).await?;
        let (rate, median, p99) = bench(&mut grpc, n).await?;
        println!(
            r#"{{"test":"tonic_unary","transport":"TcpStream","calls":{n},"calls_per_s":{rate:.0},"median_us":{median:.1},"p99_us":{p99:.1}}}"#
        );
    }
    Ok(())
}

fn run(mode: &str, args: &[String]) -> Res<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let work = async {
            match mode {
                "server" => server(args).await,
                _ => client(args).await,
            }
        };
        tokio::time::timeout(LIMIT, work)
            .await
            .map_err(|_| "time limit")?
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let result = match mode {
        "server" | "client" => run(mode, &args),
        _ => both(&args),
    };
    if let Err(e) = result {
        eprintln!("grpc: {e}");
        std::process::exit(1);
    }
}

/// Starts this program as the server, runs the client against it, then stops the server.
fn both(args: &[String]) -> Res<()> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("piped")?).lines();
    let line = lines.next().ok_or("the server exited")??;
    let mut addrs = line
        .strip_prefix("listening ")
        .ok_or("no address")?
        .split(' ');
    let (rdma, tcp) = (
        addrs.next().ok_or("no address")?,
        addrs.next().ok_or("no address")?,
    );
    let mut client_args = vec![
        "client".to_string(),
        "--connect".into(),
        rdma.into(),
        "--tcp".into(),
        tcp.into(),
    ];
    client_args.extend(args.iter().cloned());
    let result = run("client", &client_args);
    drop(child.stdin.take()); // the server stops
    let status = child.wait()?;
    result?;
    if !status.success() {
        return Err(format!("the server failed: {status}").into());
    }
    println!("grpc: every check passed");
    Ok(())
}
