//! Fuzz the tasks/list cursor decoder: any text decodes to a row key of the
//! right owner or to nothing, never a panic; and every encoded cursor
//! decodes back to its row key for its owner only.
#![no_main]

use libfuzzer_sys::fuzz_target;
use taskbroker::broker::cursor::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(seq) = decode(&text, "session:fuzz") {
        assert!(seq > 0);
        // Whatever decoded is exactly what an encoder would have made.
        assert_eq!(encode(seq, "session:fuzz"), text);
    }
    if data.len() >= 8 {
        let seq = i64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8]));
        if seq > 0 {
            let owner = String::from_utf8_lossy(&data[8..]);
            let cursor = encode(seq, &owner);
            assert_eq!(decode(&cursor, &owner), Some(seq));
        }
    }
});
