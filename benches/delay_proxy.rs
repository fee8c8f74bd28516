//! A TCP relay that holds every byte for a fixed time in each direction:
//! PostgreSQL "on another machine" for scripts/bench-netdelay, where the
//! kernel has no `netem` queueing discipline to add latency to a link.
//!
//! `cargo bench --bench delay_proxy -- --listen 127.0.0.1:15432 --to
//! 127.0.0.1:5432 --delay-us 1000` relays connections to `--to`, each
//! chunk written `--delay-us` after it was read (so a round trip takes twice
//! that, plus the relay's own ~0.1 ms). Order is kept and bandwidth is not
//! limited, as with `netem delay`. One thread per direction of each
//! connection: the delay is kept to the microsecond (`nanosleep`), which a
//! 1 ms timer wheel could not. Prints `listening on ADDR` once ready and
//! runs until killed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn main() {
    let mut listen = String::from("127.0.0.1:0");
    let mut to = String::new();
    let mut delay_us: u64 = 1000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().unwrap_or_default(),
            "--to" => to = args.next().unwrap_or_default(),
            "--delay-us" => delay_us = args.next().and_then(|v| v.parse().ok()).unwrap_or(delay_us),
            // `cargo bench` passes --bench.
            _ => {}
        }
    }
    if to.is_empty() {
        eprintln!("usage: delay_proxy --to HOST:PORT [--listen ADDR] [--delay-us N]");
        std::process::exit(2);
    }
    let delay = Duration::from_micros(delay_us);
    let listener = match TcpListener::bind(&listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {listen}: {e}");
            std::process::exit(1);
        }
    };
    match listener.local_addr() {
        Ok(addr) => println!("listening on {addr}"),
        Err(e) => eprintln!("no local address: {e}"),
    }
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let to = to.clone();
        std::thread::spawn(move || match TcpStream::connect(&to) {
            Ok(server) => relay(client, server, delay),
            Err(e) => eprintln!("cannot connect to {to}: {e}"),
        });
    }
}

/// Both directions of one connection, each delayed by `delay`.
fn relay(client: TcpStream, server: TcpStream, delay: Duration) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || pump(client, server, delay));
    pump(s2, c2, delay);
    let _ = up.join();
}

/// Read from `from`, write to `to` `delay` after each read.
fn pump(mut from: TcpStream, to: TcpStream, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        let mut to = to;
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
}
