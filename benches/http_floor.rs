//! The memory floor of the HTTP stack for waiting clients: a server built
//! as the broker's connections are (tokio, hyper's HTTP/1 connection, one
//! task per connection) whose only handler reads the request's body,
//! answers the head of an SSE stream and never sends its body. scripts/bench-waiters holds N requests on it and
//! reads its RSS beside the broker's with N clients blocked in
//! `tasks/result` or `subscriptions/listen`: what the broker spends per
//! waiting client above what any server on this stack must.
//!
//! `cargo bench --bench http_floor -- --listen 127.0.0.1:0` prints
//! `listening on ADDR` once ready and runs until killed.

use std::convert::Infallible;

use axum::body::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

fn main() {
    let mut listen = String::from("127.0.0.1:0");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--listen" {
            listen = args.next().unwrap_or(listen);
        }
        // `cargo bench` passes --bench; nothing else is taken.
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("http_floor: no runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(serve(&listen));
}

async fn serve(listen: &str) {
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("http_floor: cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("listening on {addr}"),
        Err(e) => {
            eprintln!("http_floor: {e}");
            std::process::exit(1);
        }
    }
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
                // Read the whole request, as the broker does before it
                // decides to wait; answer at once with the head of an SSE
                // stream, as the broker does for a waiting client, and
                // never send its body.
                let body = axum::body::Body::new(request.into_body());
                let _ = axum::body::to_bytes(body, 1 << 20).await;
                let never = futures_util::stream::pending::<Result<Bytes, Infallible>>();
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .header("cache-control", "no-cache")
                    .body(axum::body::Body::from_stream(never))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
