//! Fuzz the JSON-RPC/MCP request decoder: any bytes are either a message or
//! a precise JSON-RPC error, never a panic; decoded requests' params go
//! through every typed params parser the server uses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskbroker::mcp::{
    CallToolParams, Incoming, InitializeParams, PaginatedParams, TaskIdParams, parse_message,
    parse_params,
};

fuzz_target!(|data: &[u8]| {
    match parse_message(data) {
        Ok(Incoming::Request { method, params, .. }) => {
            let p = params.as_ref();
            let _ = parse_params::<CallToolParams>(&method, p);
            let _ = parse_params::<TaskIdParams>(&method, p);
            let _ = parse_params::<PaginatedParams>(&method, p);
            let _ = parse_params::<InitializeParams>(&method, p);
        }
        Ok(_) => {}
        Err(e) => {
            let code = e.code.code();
            assert!((-32700..=-32600).contains(&code), "unexpected code {code}");
            assert!(!e.message.is_empty());
        }
    }
});
