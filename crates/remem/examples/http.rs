//! A hyper HTTP server and client over RDMA, between two processes on soft devices:
//! HTTP/1.1 and HTTP/2, each checked.
//!
//! The server is hyper-util's `auto` connection builder (HTTP/1.1 or HTTP/2, whichever the
//! client speaks) on each stream its remem listener accepts, wrapped in `TokioIo` as a
//! `TcpStream` would be. `GET /hello` answers `hello over RDMA`; `POST /echo` answers its
//! body. The client is hyper-util's legacy client with [`RdmaConnector`]: once for
//! HTTP/1.1, once HTTP/2 only.
//!
//! - `http` runs both: it starts itself as the server, runs the client, and exits non-zero
//!   if a check fails.
//! - `http server [--device DEV]` prints `listening ADDR` and serves until its standard
//!   input closes.
//! - `http client --connect ADDR [--device DEV]`.
//!
//! `cargo run -p remem --features hyper --example http`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use remem::stream::hyper::RdmaConnector;
use remem::{RdmaBuilder, RdmaStream};
use std::convert::Infallible;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The longest the example runs.
const LIMIT: Duration = Duration::from_secs(120);

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

async fn handle(req: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let answer = match (req.method(), req.uri().path()) {
        (&Method::GET, "/hello") => {
            Response::new(Full::new(Bytes::from_static(b"hello over RDMA")))
        }
        (&Method::POST, "/echo") => match req.into_body().collect().await {
            Ok(body) => Response::new(Full::new(body.to_bytes())),
            Err(_) => {
                let mut r = Response::new(Full::new(Bytes::new()));
                *r.status_mut() = StatusCode::BAD_REQUEST;
                r
            }
        },
        _ => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    };
    Ok(answer)
}

async fn server(args: &[String]) -> Res<()> {
    let device = arg(args, "--device").unwrap_or_else(|| "soft@127.0.0.2:0".into());
    let rdma = RdmaBuilder::new().device(device).build()?;
    let listener = rdma.listen("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    // Serves until the parent closes our standard input.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read(&mut [0]);
        let _ = stop.send(());
    });
    loop {
        let conn = tokio::select! {
            c = listener.accept() => c?,
            _ = &mut stopped => return Ok(()),
        };
        let stream = RdmaStream::new(conn)?;
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let service = hyper::service::service_fn(handle);
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("http server: a connection failed: {e}");
            }
        });
    }
}

/// GET /hello and POST /echo (1 MiB, and 100 small ones) with `client`, checked.
async fn exchange(
    client: &Client<RdmaConnector, Full<Bytes>>,
    addr: &str,
    version: &str,
) -> Res<()> {
    let res = client.get(format!("http://{addr}/hello").parse()?).await?;
    let got_version = res.version();
    let body = res.into_body().collect().await?.to_bytes();
    if body != "hello over RDMA" {
        return Err(format!("{version}: GET /hello answered {body:?}").into());
    }
    let big: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for (i, payload) in std::iter::once(big)
        .chain((0..100).map(|i| format!("small {i}").into_bytes()))
        .enumerate()
    {
        let req = Request::post(format!("http://{addr}/echo"))
            .body(Full::new(Bytes::from(payload.clone())))?;
        let body = client
            .request(req)
            .await?
            .into_body()
            .collect()
            .await?
            .to_bytes();
        if body != payload {
            return Err(format!(
                "{version}: POST /echo {i} came back wrong ({} bytes)",
                body.len()
            )
            .into());
        }
    }
    println!("checked over {version} ({got_version:?}): GET, a 1 MiB POST and 100 small ones");
    Ok(())
}

async fn client(args: &[String]) -> Res<()> {
    let device = arg(args, "--device").unwrap_or_else(|| "soft@127.0.0.1:0".into());
    let addr = arg(args, "--connect").ok_or("--connect ADDR")?;
    let rdma = RdmaBuilder::new().device(device).build()?;
    let http1 = Client::builder(TokioExecutor::new()).build(RdmaConnector::new(rdma.clone()));
    exchange(&http1, &addr, "HTTP/1.1").await?;
    let http2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(RdmaConnector::new(rdma));
    exchange(&http2, &addr, "HTTP/2").await?;
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
        _ => both(),
    };
    if let Err(e) = result {
        eprintln!("http: {e}");
        std::process::exit(1);
    }
}

/// Starts this program as the server, runs the client against it, then stops the server.
fn both() -> Res<()> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("server")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("piped")?).lines();
    let line = lines.next().ok_or("the server exited")??;
    let addr = line
        .strip_prefix("listening ")
        .ok_or("no address")?
        .to_string();
    let result = run("client", &["client".into(), "--connect".into(), addr]);
    drop(child.stdin.take()); // the server stops
    let status = child.wait()?;
    result?;
    if !status.success() {
        return Err(format!("the server failed: {status}").into());
    }
    println!("http: every check passed");
    Ok(())
}
